"""``nki.isa`` (new dialect, dst-passing): Tier-1 instructions lowered to kernel.json ops.

Every instruction builds one op statement and hands it to ``nsim.tracer.emit``.
"""
from __future__ import annotations

import enum
import os
import sys
import warnings

import numpy as np

from .. import _isa
from .. import tracer as _tr
from ..tracer import NkiTensor, make_error, KernelError, OperandError
from . import language as _nl

_API_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_api.py")

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


def _core_values():
    """The parameters (config_values) of the core NKI_NC_VERSION / NEURON_PLATFORM_TARGET_OVERRIDE names, else
    of the configured core (the running kernel's config, else the ``nsim.options`` default)."""
    from .._kernel import PLATFORM_CONFIG
    for var in ("NKI_NC_VERSION", "NEURON_PLATFORM_TARGET_OVERRIDE"):
        v = _tr.env_get(var)
        if v and v in PLATFORM_CONFIG:
            return _isa.config_values(PLATFORM_CONFIG[v])
    # (the cached dict, read only: per matmul; while tracing, kept on the tracer for the config and overrides
    # objects it holds, as nl.tile_size's values: language._current_tile_sizes)
    t = _tr.active()
    if t is not None:
        c = t.__dict__.get("_nl_core_values")
        if c is not None and c[0] is t.config and c[1] is t.overrides:
            return c[2]
        values = _isa._config_values(str(t.config), tuple(_isa._overrides(t.overrides)))
        t._nl_core_values = (t.config, t.overrides, values)
        return values
    cfg, ovr = _nl._configured()
    return _isa._config_values(str(cfg), tuple(_isa._overrides(ovr)))


def get_nc_version():
    """The generation (the ``generation`` parameter of the preset) NKI_NC_VERSION /
    NEURON_PLATFORM_TARGET_OVERRIDE names, else that of the configured core (the running kernel's config,
    else the ``nsim.options`` default)."""
    return nc_version(_core_values()["generation"])


def get_nc_sub_version():
    return 0


from nsim._errors import NkiValidationError  # noqa: E402  (an AssertionError, nki-api.md 4.1)


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


def _engine(e, what):
    """The engine name of ``engine=`` for the op ``what`` (None: the compiler picks), one of the engines
    its row of isa/opcodes.def allows."""
    allowed = _isa.OP_ENGINES[what]
    if e is None:
        return None
    if isinstance(e, str):
        name = e
    else:
        if type(e) is int:  # nki-api.md 1.3: an integer for an enum parameter is deprecated (NKI 0.3 rejects it)
            _tr.nki_warn("{}(engine={}): an integer for nisa.engine is deprecated (NKI 0.3 and later reject it); "
                         "use nisa.engine.<name>".format(what, e), stacklevel=4)
        try:
            e = engine(int(e))
        except ValueError:
            raise make_error("BadEngine", "bad engine {!r}".format(e))
        if e == engine.unknown:
            return None
        name = _ENGINE_NAMES.get(e)
    if name is None or (allowed is not None and name not in allowed):
        raise make_error("BadEngine", "engine {} is not allowed for {} (allowed: {})".format(
            getattr(e, "name", e), what, ", ".join(allowed or ())))
    if name == "scalar" and what in ("tensor_scalar", "tensor_copy") and get_nc_version() < nc_version.gen3:
        # nki-api.md 2.1: ScalarE runs tensor_scalar / tensor_copy from gen3 on (isa/opcodes.def allows the
        # engine for every gen; the scheduler's choice already follows scalar.tensor_ops)
        raise make_error("NotOnGeneration", "{}: engine=scalar needs gen3 or later (trn2, trn3), this core is "
                         "nc_version {}; use nisa.activation (op=nl.copy, scale=, bias=) or the vector engine".format(
                             what, int(get_nc_version())))
    return name


def _t(x, slot, what):
    if _tr.active() is None:  # outside a kernel: a clear error first (its message built only then: per operand)
        _tr.current("nisa." + what)
    if not isinstance(x, NkiTensor):
        raise make_error("BadOperandKind", "{}: operand '{}' must be a tensor (view), got {!r}".format(
            what, slot, _tr.shown(x)))
    return x


def _op(name, **fields):
    tr = _tr.active()
    if tr is None:  # (the message built only when needed: this runs for every instruction)
        _tr.current("nisa." + name)
    stmt = {"op": name}
    waits = ()
    for k, v in fields.items():
        if v is None:
            continue
        if isinstance(v, NkiTensor):
            waits += v._regw  # a view addressed by a register waits for its register_load
            # the runtime part of a dma_copy / tensor_copy side is in the "offsets" field (_runtime_fields)
            v = v.access(indirect_ok=name in ("dma_copy", "tensor_copy") and k in ("dst", "src"))
        if k == "flags" and not v:
            continue
        stmt[k] = v
    if waits:
        stmt["after"] = list(dict.fromkeys(waits))
    return NkiInstruction(tr.emit(stmt))


def _is_scalar(x):
    return isinstance(x, (int, float, np.integer, np.floating, bool))


def _imm(vals):
    """imm list up to the last non-default entry."""
    d = list(_isa.IMM_DEFAULT)
    for i, v in vals.items():
        d[i] = _fimm(v)  # (+-inf / nan as JSON strings: json.dumps would write the invalid -Infinity)
    return d


def _rcmd(c):
    if c is None:
        return None
    c = reduce_cmd(int(c))
    return None if c == reduce_cmd.idle else c.name


# --------------------------------------------------------------------------------------------------
# Tier 1
# --------------------------------------------------------------------------------------------------


def _priority(priority, opname):
    """``priority=`` of a DMA (0-3, the QoS classes of the gen4 DMA arbitration): gen4 only (nki-api.md 2.1, 4.3);
    the arbitration is not modelled (the transfer is timed as without)."""
    if priority is not None and get_nc_version() < nc_version.gen4:
        raise make_error("NotOnGeneration", "{}: priority= needs gen4 (trn3), this core is nc_version {}".format(
            opname, int(get_nc_version())))


def _user_call():
    """Whether the new-dialect function calling this was called by the user's kernel (not by a Beta-1 twin or
    another nsim function): the first frame above it outside nki/_api.py's wrapper is not nsim's."""
    f = sys._getframe(2)
    while f is not None and os.path.abspath(f.f_code.co_filename) == _API_FILE:
        f = f.f_back
    return f is not None and not _tr._is_internal(f.f_code.co_filename)


_dma_flags = []  # extra flags of the dma_copy calls of a dma_compute (set while it runs)


def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown,
             name=None, **kwargs):
    _t(dst, "dst", "dma_copy")
    _t(src, "src", "dma_copy")
    _priority(priority, "dma_copy")
    flags = []
    rmw = kwargs.get("dst_rmw_op")
    if rmw is not None:  # Beta 1 / 0.2: dst += src (accumulating DMA)
        if _nl.opcode(rmw).alu != "add":
            raise make_error("BadArgument", "dma_copy(dst_rmw_op=): only np.add / nl.add is supported by the "
                             "hardware, got {!r}".format(rmw))
        flags.append("accumulate")
    flags += _dma_flags  # (dma_compute's unique_indices)
    if dst.size != src.size:
        raise make_error("ElementCountMismatch", "dma_copy: dst has {} elements, src has {}".format(
            dst.size, src.size))
    psum = [side for side, v in (("dst", dst), ("src", src)) if v.buffer == "psum"]
    if psum and _user_call():  # (Beta 1 and nsim's own conveniences call it too: PSUM is legal there)
        _tr.nki_warn("nisa.dma_copy: {} is in PSUM; NKI 0.3 and later reject a PSUM source or destination of a DMA "
                     "(copy between PSUM and SBUF with nisa.tensor_copy); nsim runs it as Beta 1 / 0.2 did "
                     "(nki-api.md 2.1)".format(" and ".join(psum)), stacklevel=3)
    eng = _dge_trigger(dge_mode, _engine(engine, "dma_copy"), dst, src, "dma_copy")
    if (dst._oob or src._oob) and _oob_skip(oob_mode):
        return None  # a register scalar_offset outside its dim (NkiTensor.ap): the transfer is skipped
    fields = {}
    if dst.is_indirect() or src.is_indirect():
        if dst.is_indirect() and src.is_indirect():
            raise make_error("NotSupported", "dma_copy: only one side may have runtime offsets")
        if _dge(dge_mode) == "hwdge":
            raise make_error("BadArgument", "dma_copy: runtime (vector/scalar) offsets need dge_mode=swdge or "
                             "unknown (hwdge cannot gather)")
        fields, more = (dst if dst.is_indirect() else src)._ind.fields(dst.is_indirect(), _oob_skip(oob_mode))
        flags += more
        eng = "gpsimd"  # swdge: GpSimd builds the descriptors of a gather/scatter (neuroncore.md 3.3)
    return _op("dma_copy", engine=eng, dst=dst, src=src, flags=flags, **fields)


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, name=None,
                **kwargs):
    """``dst = sum_i srcs[i] * scales[i]`` on the DMA queues (``reduce_op`` only ``nl.add``, scales all 1.0 or
    None, at most 16 sources of equal element counts). RMW forms: a source that is ``dst`` itself (e.g. the
    same ``.ap(vector_offset=...)`` HBM view: a scatter-add) is the accumulator the other source adds to.

    nsim models it as accumulating ``dma_copy`` transfers: the first source copied into ``dst`` (unless
    ``dst`` is a source), each other source added (``dst += src``, rounded to ``dst``'s dtype after each
    add; the hardware sums in fp32 once), one transfer per source (docs/timing-model.md)."""
    _t(dst, "dst", "dma_compute")
    srcs = list(srcs) if isinstance(srcs, (list, tuple)) else [srcs]
    if not 1 <= len(srcs) <= 16:
        raise make_error("BadArgument", "dma_compute: 1 to 16 srcs, got {}".format(len(srcs)))
    for i, x in enumerate(srcs):
        _t(x, "srcs[{}]".format(i), "dma_compute")
        if x.size != dst.size:
            raise make_error("ElementCountMismatch", "dma_compute: srcs[{}] has {} elements, dst has {}".format(
                i, x.size, dst.size))
    if _nl.opcode(reduce_op, "reduce_op").alu != "add":
        raise make_error("BadArgument", "dma_compute: reduce_op must be nl.add, got {!r}".format(reduce_op))
    if scales is not None and any(float(c) != 1.0 for c in scales):
        raise make_error("BadArgument", "dma_compute: scales must all be 1.0 (or None), got {!r}".format(scales))
    if scales is not None and len(scales) != len(srcs):
        raise make_error("BadArgument", "dma_compute: {} scales for {} srcs".format(len(scales), len(srcs)))

    def same(a, b):
        return a is b or (a.access(indirect_ok=True) == b.access(indirect_ok=True) and
                          (a._ind is None) == (b._ind is None) and
                          (a._ind is None or (a._ind.offsets is b._ind.offsets and a._ind.scalar == b._ind.scalar)))

    acc = [x for x in srcs if same(x, dst)]
    rest = [x for x in srcs if not same(x, dst)]
    if len(acc) > 1:
        raise make_error("BadArgument", "dma_compute: dst appears {} times in srcs".format(len(acc)))
    if dst.is_indirect() and not acc:
        raise make_error("BadArgument", "dma_compute: an indirect dst (scatter) must also be one of the srcs "
                         "(dst[idx] += src)")
    last = None
    # A scatter-add (dst[idx] += src) promising unique rows: the sanitizer checks the promise (NSIM-W508).
    global _dma_flags
    _dma_flags = ["unique_indices"] if unique_indices and acc and dst.is_indirect() else []
    try:
        for i, x in enumerate(rest):
            last = dma_copy(dst, x, oob_mode=oob_mode, dst_rmw_op=_nl.add if (acc or i) else None)
    finally:
        _dma_flags = []
    return last


def _dge(m):
    try:
        return dge_mode(int(m)).name
    except (TypeError, ValueError):
        raise make_error("BadArgument", "bad dge_mode {!r}".format(m))


#: The trigger engine of each descriptor-generation mode (neuroncore.md 3.3: static descriptors from Sync, software DGE
#: on GpSimd, hardware DGE on a sequencer; nsim costs hwdge's trigger (dma.hwdge_instr) on Scalar).
_DGE_TRIGGER = {"none": "sync", "swdge": "gpsimd", "hwdge": "scalar"}


def _dge_trigger(mode, eng, dst, src, opname):
    """The trigger engine of a DMA given its ``dge_mode`` (nki-api.md 2.1): the mode's engine (_DGE_TRIGGER) unless
    ``engine=`` names one or the mode is unknown (the compiler picks), checking that hwdge is on gen3+ and copies
    without a cast."""
    m = _dge(mode)
    if m == "hwdge":
        if get_nc_version() < nc_version.gen3:
            raise make_error("NotOnGeneration", "{}: dge_mode=hwdge needs gen3 or later (nc_version {})".format(
                opname, int(get_nc_version())))
        if _tr._dtype_name(dst.dtype) != _tr._dtype_name(src.dtype):
            raise make_error("BadDtype", "{}: dge_mode=hwdge copies without a cast: src is {}, dst {}".format(
                opname, _tr._dtype_name(src.dtype), _tr._dtype_name(dst.dtype)))
    return eng if eng is not None else _DGE_TRIGGER.get(m)


def _oob_skip(m):
    try:
        return oob_mode(int(m)) == oob_mode.skip
    except (TypeError, ValueError):
        raise make_error("BadArgument", "bad oob_mode {!r}".format(m))


def tensor_copy(dst, src, engine=engine.unknown, name=None, dtype=None, **kwargs):
    """``dst = cast(src)`` per partition. One side may be an on-chip view with a runtime offset
    (``t.ap(..., scalar_offset=sbuf_scalar, indirect_dim=d)``, ``t.select(d, sbuf_scalar)``, ``nl.ds(sbuf_scalar,
    n)``; Beta 1: ``tensor_copy_dynamic_src/dst``): the copy then reads (writes) the view moved by that value
    at run time, at the dynamic-copy cost (docs/isa.md). ``dtype=`` (in the nki-samples matmul tutorial, not in the 0.6
    signature) is accepted: the dtype of ``dst`` wins, with a warning when they differ (nki-api.md 1.3)."""
    if dtype is not None and isinstance(dst, NkiTensor) and _tr._dtype_name(dtype) != _tr._dtype_name(dst.dtype):
        warnings.warn("nisa.tensor_copy: dtype={} differs from dst's {}; dst's dtype is written".format(
            _tr._dtype_name(dtype), _tr._dtype_name(dst.dtype)), _tr.NkiWarning, stacklevel=2)
    return _tensor_copy(dst, src, engine)


def _tensor_copy(dst, src, engine=engine.unknown, dynamic=False, what="tensor_copy"):
    """nisa.tensor_copy; ``dynamic``: a dynamic copy (Beta-1 tensor_copy_dynamic_src/dst) even when neither
    side has a runtime offset (the cost floor, flag dynamic_addr)."""
    _t(dst, "dst", what)
    _t(src, "src", what)
    fields, flags = _dynamic_fields(what, dst, src, dynamic)
    return _op("tensor_copy", engine=_engine(engine, "tensor_copy"), dst=dst, src=src, flags=flags, **fields)


def _dynamic_fields(what, dst, src, dynamic):
    """kernel.json fields and flags of a tensor_copy whose src or dst has a runtime offset (an on-chip
    scalar indirection); ``dynamic``: the instruction is a dynamic copy even without one (its cost floor)."""
    if dst.is_indirect() and src.is_indirect():
        raise make_error("DynamicIndex", "{}: only one of src and dst may have a runtime index".format(what))
    side = dst if dst.is_indirect() else src if src.is_indirect() else None
    if side is None:
        return {}, ["dynamic_addr"] if dynamic else []
    if side.buffer not in _tr.ON_CHIP or not side._ind.scalar:
        raise make_error("DynamicIndex", "{}: the runtime-indexed {} must be an on-chip view with one (scalar) "
                         "runtime offset (HBM gathers are dma_copy's)".format(what, "dst" if side is dst else "src"))
    fields, flags = side._ind.fields(side is dst, False)
    return fields, flags + ["dynamic_addr"]


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None, **kwargs):
    _t(dst, "dst", "tensor_tensor")
    _t(data1, "data1", "tensor_tensor")
    _t(data2, "data2", "tensor_tensor")
    # (engine unset: the kernel's lowering picks isa::default_engine, GpSimd for all-int32 operands, nki-api.md 2.1)
    return _op("tensor_tensor", engine=_engine(engine, "tensor_tensor"), dst=dst,
               data1=data1, data2=data2, alu0=_nl.alu_name(op))


def memset(dst, value, engine=engine.unknown, name=None, **kwargs):
    _t(dst, "dst", "memset")
    eng = _engine(engine, "memset")
    if np.issubdtype(dst.dtype, np.integer) or dst.dtype == np.bool_:
        v = _tr.int_immediate(value, "memset: value")
        # the immediate is an int32 and store_int wraps modulo 2^bits (docs/dtypes.md): pass v modulo 2^32 so a
        # uint32 fill of 2^31 ... 2^32 - 1 (0xFFFFFFFF masks) works; bool keeps v != 0
        v = int(v != 0) if dst.dtype == np.bool_ else (v + 2 ** 31) % 2 ** 32 - 2 ** 31
        return _op("memset", engine=eng, dst=dst, iimm=[v])
    return _op("memset", engine=eng, dst=dst, imm=[_fimm(value)])  # (+-inf / nan as JSON strings)


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
        raise make_error("BadOperandKind", "{}: operand{} must be a scalar or a (P, 1) tensor, got "
                         "{!r}".format(what, i, x))


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None, **kwargs):
    _t(dst, "dst", "tensor_scalar")
    _t(data, "data", "tensor_scalar")
    fields, flags = {}, []
    _operand(operand0, 0, fields, flags, "tensor_scalar")
    if (op1 is None) != (operand1 is None) and not (op1 is not None and _nl.opcode(op1).alu in _UNARY):
        raise make_error("MissingOperand", "tensor_scalar: op1 and operand1 must both be given or both "
                         "be None")
    _operand(operand1, 1, fields, flags, "tensor_scalar")
    if reverse0:
        flags.append("reverse0")
    if reverse1:
        flags.append("reverse1")
    imm = fields.pop("imm", None)
    eng = _engine(engine, "tensor_scalar")
    alu0, alu1 = _nl.alu_name(op0, "op0"), _nl.alu_name(op1, "op1") if op1 is not None else None
    for alu, operand, nm in ((alu0, operand0, "operand0"), (alu1, operand1, "operand1")):
        # nki-api.md 2.1: unary op codes ignore their operand, "which must be None or 0"
        if alu in _UNARY_OPS and operand is not None and not (_is_scalar(operand) and operand == 0):
            raise make_error("BadImmediate", "tensor_scalar: op {} is unary and ignores its operand: {} must be None "
                             "or 0, got {!r}".format(alu, nm, operand if _is_scalar(operand) else "a tensor"))
    if eng == "gpsimd" and {alu0, alu1} - {"rsqrt", None}:
        # spec nki-api.md 2.1 ("GpSimd only for rsqrt"), 4.3 (engine=gpsimd for a non-rsqrt tensor_scalar is a
        # validation error); engine unset, the compiler model may still place it there (compiler.md 2)
        raise make_error("BadEngine", "tensor_scalar: engine=gpsimd runs rsqrt only, got op0={}{}; use "
                         "nisa.tensor_tensor on GpSimd, the vector or scalar engine, or leave engine unset".format(
                             alu0, ", op1={}".format(alu1) if alu1 else ""))
    return _op("tensor_scalar", engine=eng, dst=dst,
               data=data, operand0=fields.get("operand0"), operand1=fields.get("operand1"),
               alu0=alu0, alu1=alu1, flags=flags, imm=_imm(imm) if imm else None,
               iimm=_bitvec_iimm(imm, (alu0, alu1)))


_BITVEC = _isa.alu_of_class("bitvec")
_LOGICAL = _isa.alu_of_class("logical")


def _bitvec_iimm(imm, alus):
    """A bit-vector tensor_scalar's integer immediates, exactly: iimm[i] holds immediate i as an int32 bit pattern
    (imm[i], a float32, keeps 24 bits: x & 0x0ff0ff0f was x & 0x0ff0ff10; nki-api.md 2.0 "operate on bit patterns
    without casting"). The semantics take iimm[i] when it rounds to imm[i] (docs/kernel-json.md); None when no
    immediate is an integer of such an op."""
    if not imm or not any(a in _BITVEC for a in alus if a):
        return None
    return _int_iimm(imm)


def _int_iimm(imm):
    """iimm[0..1] for the integer immediates of ``imm`` (int32 bit patterns), or None when none is an integer."""
    out = [0, 0]
    hit = False
    for i, v in imm.items():
        if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and i < 2:
            u = int(v) & 0xFFFFFFFF
            out[i] = u - (1 << 32) if u >= 1 << 31 else u
            hit = True
    return out if hit else None


_UNARY = _isa.alu_of_arity(1)  # ops that ignore their second operand (isa/alu_ops.def arity 1)
_UNARY_OPS = _isa.alu_of_class("unary")  # abs, square, relu, rsqrt, reciprocal, negative (isa/alu_ops.def Unary)


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None,
              **kwargs):
    _t(dst, "dst", "nc_matmul")
    _t(stationary, "stationary", "nc_matmul")
    _t(moving, "moving", "nc_matmul")
    tr = _tr.current("nisa.nc_matmul")
    if not tile_size:
        m = stationary.size // max(1, stationary.shape[0])
        stationary_limit(m // (1 if perf_mode in (None, matmul_perf_mode.none, "none") else 2),
                         "nisa.nc_matmul", "stationary {}".format(tuple(stationary.shape)))
    flags = []
    if tr.matmul_accumulates(dst, accumulate):
        flags.append("accumulate")
    if is_transpose:
        flags.append("is_transpose")
    if is_stationary_onezero or is_moving_onezero:
        flags.append("onezero")
    double_row = perf_mode not in (None, matmul_perf_mode.none, "none")
    matmul_dtype_rules(stationary, moving, "nisa.nc_matmul", double_row, is_transpose)
    if double_row:
        # nki-api.md 2.1: stationary [K, 2, M], moving [K, 2, N], the middle dim exactly 2 (a 2-D or [K, 4, 32]
        # operand was read as [K, 2, F / 2] before, without a word)
        for what, t in (("stationary", stationary), ("moving", moving)):
            if len(t.shape) != 3 or t.shape[1] != 2:
                raise make_error("ShapeMismatch", "nisa.nc_matmul: perf_mode=double_row takes a {} of shape [K, 2, {}] "
                                 "(the middle dim exactly 2: the two rows of each partition contracted together), "
                                 "got {}".format(what, "M" if what == "stationary" else "N", tuple(t.shape)))
        flags.append("double_row")
    return _op("nc_matmul", dst=dst, stationary=stationary, moving=moving, flags=flags,
               iimm=_pe_tile(tile_position, tile_size, "nc_matmul"))


def matmul_dtype_rules(stationary, moving, api, double_row=False, transpose=False):
    """nc_matmul's input dtype rules (nki-api.md 2.1 Dtypes and perf_mode), at the call's line: an fp32/tf32 input
    needs an fp32/tf32 partner; float8_e4m3fn is a gen4 input and does not mix with float8_e4m3; double_row needs
    gen3 or later and fp8 inputs (else nsim would time a bf16 double_row matmul at twice the hardware's rate). The
    rules are isa::matmul_dtype_rule's (isa/isa.cpp, through ``_nsim``), which the kernel's verification applies to
    kernel.json too."""
    core = _core_values()
    broken = _isa.matmul_dtype_rule(_tr.dtype_name(stationary.dtype), _tr.dtype_name(moving.dtype),
                                    core["generation"], core["tensor.fp8_double_row"], double_row, transpose)
    if broken is not None:
        raise make_error(broken[0], "{}: {}".format(api, broken[1]))


def stationary_limit(m, api, what):
    """MatmulLimit at the call's line for a stationary operand of M = ``m`` columns (its free size) wider than
    the PE array: checked here because the kernel's verification would first report the PSUM result of M
    partitions (a tile of 256 partitions, or a dst that is not M partitions tall), not the matmul."""
    cols = _nl.tile_size.gemm_stationary_fmax
    if m > cols:
        raise make_error("MatmulLimit", "{}: {} has M = {} columns (its free size, the result's partitions), "
                         "more than the {} columns of the PE array; tile M into pieces of at most {} "
                         "(nl.tile_size.gemm_stationary_fmax)".format(api, what, m, cols, cols))


def transpose_limit(p, f, api):
    """ShapeMismatch at the call's line for a TensorE transpose of a [p, f] tile larger than the PE array (the
    kernel's verification would first report the PSUM result of f partitions, not the transpose)."""
    n = _nl.tile_size.pmax  # the PE array's rows and columns
    if p > n or f > n:
        raise make_error("ShapeMismatch", "{}: transpose input [{}, {}] exceeds {} x {} on the tensor engine; "
                         "transpose it in {} x {} blocks".format(api, p, f, n, n, n, n))


def _pe_tile(tile_position, tile_size, opname):
    """The iimm of a matmul on a tile of the PE array, ``[row, column, rows, columns]`` (nki-api.md 2.1 PE tiling: matmuls
    on disjoint tiles run side by side), or None without tiling. Both arguments are (row, column) pairs or both are
    omitted; the sizes, alignment and fit are verify()'s rules (isa/isa.cpp verify_pe_tile: BadArgument / MatmulLimit
    at the call's line when the kernel runs)."""
    pos = tuple(tile_position) if tile_position else ()
    size = tuple(tile_size) if tile_size else ()
    if not pos and not size:
        return None
    if len(pos) != 2 or len(size) != 2:
        raise make_error("BadArgument", "{}: tile_position and tile_size must both be (row, column) pairs or both be "
                         "omitted, got {!r} and {!r}".format(opname, tile_position, tile_size))
    # the position may move with a loop kept as a loop (an index expression in the IR, evaluated per iteration)
    vals = [x.resolved() if isinstance(x, _tr.Sym) else int(x) for x in pos] + [int(x) for x in size]
    if vals[2] < 1 or vals[3] < 1:
        raise make_error("BadArgument", "{}: tile_size must be positive, got {!r}".format(opname, tile_size))
    return vals


def _bias_scale(bias, scale, opname):
    """Activation bias and scale: a Python scalar goes to imm[3] / imm[2], a (P, 1) tile to its slot."""
    imm, fields = {}, {}
    if bias is not None:
        if _is_scalar(bias):
            imm[3] = bias
        else:
            fields["bias"] = _t(bias, "bias", opname)
    if _is_scalar(scale):
        if float(scale) != 1.0:
            imm[2] = scale
    else:
        fields["scale"] = _t(scale, "scale", opname)
    return imm, fields


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               name=None, **kwargs):
    _t(dst, "dst", "activation")
    _t(data, "data", "activation")
    imm, fields = _bias_scale(bias, scale, "activation")
    alu1 = None
    if reduce_op is not None:
        alu1 = _nl.alu_name(reduce_op, "reduce_op")
        if alu1 != "add":
            raise make_error("BadArgument", "activation: reduce_op must be nl.add")
    elif reduce_res is not None or _rcmd(reduce_cmd) is not None:
        alu1 = "add"
    if reduce_res is not None:
        fields["reduce_res"] = _t(reduce_res, "reduce_res", "activation")
    return _op("activation", dst=dst, data=data, act=_nl.act_name(op), alu1=alu1, reduce_cmd=_rcmd(reduce_cmd),
               imm=_imm(imm) if imm else None, **fields)


def nc_transpose(dst, data, engine=engine.unknown, name=None, **kwargs):
    _t(dst, "dst", "nc_transpose")
    _t(data, "data", "nc_transpose")
    if dst.dtype != data.dtype:  # (Beta 1 casts: its dtype= / dst= go through transpose_into)
        raise make_error("BadDtype", "nisa.nc_transpose: dst is {} but data is {}: a transpose moves the elements "
                         "unchanged, dst must have data's dtype; cast when evicting the result (nisa.tensor_copy or "
                         "nisa.activation into a tile of the other dtype)".format(
                             _tr.dtype_name(dst.dtype), _tr.dtype_name(data.dtype)))
    return transpose_into(dst, data, engine)


def transpose_into(dst, data, engine=engine.unknown):
    """nc_transpose of ``data`` into ``dst``, which may be of another dtype (Beta 1: cast on the way)."""
    eng = _engine(engine, "nc_transpose")
    if eng is None:
        p = data.shape[0]
        f = data.size // p if p else 0
        eng = "vector" if p <= 32 and f <= 32 else "tensor"
    return _op("nc_transpose", engine=eng, dst=dst, data=data)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None, **kwargs):
    _t(dst, "dst", "tensor_reduce")
    _t(data, "data", "tensor_reduce")
    if negate and _nl.alu_name(op) in _BITVEC | _LOGICAL:  # nki-api.md 2.1: "negate=True ... (arithmetic ops only)"
        raise make_error("BadArgument", "tensor_reduce: negate=True needs an arithmetic op, got nl.{}".format(
            _nl.alu_name(op)))
    nd = data.ndim
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    axes = sorted(int(a) + nd if int(a) < 0 else int(a) for a in axes)
    if not axes or axes[0] < 1 or axes != list(range(axes[0], nd)):
        raise make_error("BadArgument", "tensor_reduce: axis {} must be the last free dims of the "
                         "data view of shape {} (ending at dim {}; dim 0 cannot be reduced)".format(
                             axis, tuple(data.shape), nd - 1))
    if axes[0] == 1:
        axis_count = 0  # all free dims
    elif isinstance(data._st, _tr._ViewStorage):
        # a re-dimensioned view: the trailing IR dims of its access that hold exactly the reduced elements
        e = int(np.prod(data.shape[axes[0]:], dtype=np.int64))
        acc = data.access()
        sizes = [1] * len(data._st.base.shape) if isinstance(acc, str) else [
            (x if isinstance(x, int) else x.get("size", x.get("broadcast", 1))) if isinstance(x, dict) else 1
            for x in acc["index"]]
        if isinstance(acc, str):
            sizes = list(data._st.base.shape)
        elif "order" in acc:  # a permuted view: the dims in the order the access visits them
            sizes = [sizes[k] for k in acc["order"]]
        axis_count = None
        prod = 1
        for r in range(len(sizes) - 1, 0, -1):
            prod *= sizes[r]
            if prod == e:
                axis_count = len(sizes) - r
                break
        if axis_count is None:  # the reduced dims are not IR dims of the access: reduce a copy
            tmp = _tr.current("tensor_reduce").tile("sbuf", np.float32 if data.buffer == "psum" else data.dtype,
                                                    tuple(data.shape))
            tensor_copy(dst=tmp, src=data)
            return tensor_reduce(dst, op, tmp, axis, negate=negate, keepdims=keepdims)
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


# --------------------------------------------------------------------------------------------------
# Tier 2 (§2.2)
# --------------------------------------------------------------------------------------------------

FP32_MIN = float(np.float32(-3.4028235e38))


def _immlist(vals):
    """imm list (fp32 immediates) up to the last given index; unset entries 0 (imm[2] = 1: the activation
    scale default, harmless for other ops)."""
    if not vals:
        return None
    d = list(_isa.IMM_DEFAULT)[:max(vals) + 1]
    for i, v in vals.items():
        d[i] = _fimm(v)
    return d


def _fimm(v):
    v = float(v)
    if v != v:
        return "nan"
    if v == float("inf"):
        return "inf"
    if v == float("-inf"):
        return "-inf"
    if abs(v) > _F32_MAX:  # the immediate is fp32: round as np.float32 does (to +-inf, or +-max near it)
        with np.errstate(over="ignore"):
            return _fimm(np.float32(v))
    return v


_F32_MAX = float(np.finfo(np.float32).max)


def _scalar_or_vector(x, slot, what, imm_index, fields, imm, flags=None, flag=None):
    """A per-partition operand: a compile-time scalar -> imm[imm_index] (+ flag), a (P,1) tensor -> slot."""
    if x is None:
        return
    if _is_scalar(x):
        imm[imm_index] = x
        if flag:
            flags.append(flag)
    elif isinstance(x, NkiTensor):
        fields[slot] = x
    else:
        raise make_error("BadOperandKind", "{}: {} must be a scalar or a (P, 1) tensor, got {!r}".format(
            what, slot, x))


def _pattern_iimm(pattern, offset, channel_multiplier, what):
    """iimm of iota / affine_select: offset, channel_multiplier, then 4 x (step, num), outermost first;
    missing (outer) dims are (0, 1)."""
    try:
        pat = [[int(s), int(n)] for s, n in pattern]
    except (TypeError, ValueError):
        raise make_error("BadOperandKind", "{}: pattern must be a list of [step, num] pairs, got "
                         "{!r}".format(what, pattern))
    if len(pat) > 4:
        raise make_error("BadOperandKind", "{}: at most 4 [step, num] pairs, got {}".format(what, len(pat)))
    pat = [[0, 1]] * (4 - len(pat)) + pat
    # the offset may move with a loop kept as a loop (an index expression in the IR, evaluated per iteration)
    offset = offset.resolved() if isinstance(offset, _tr.Sym) else int(offset)
    iimm = [offset, int(channel_multiplier)]
    for s, n in pat:
        iimm += [s, n]
    return iimm


def _npat(pattern):
    n = 1
    for _s, k in pattern:
        n *= int(k)
    return n


#: The transposes dma_transpose does, by rank (nki-api.md 2.1; each the default axes of its rank): the first and last
#: dims swap, the middle ones stay (iimm[0] = their elements; isa/semantics/dma_transpose.cpp).
DMA_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error,
                  name=None, **kwargs):
    _t(dst, "dst", "dma_transpose")
    _t(src, "src", "dma_transpose")
    _priority(priority, "dma_transpose")
    forms = DMA_TRANSPOSE_AXES
    if src.ndim not in forms or dst.ndim != src.ndim:
        raise make_error("BadArgument", "dma_transpose: src and dst must both be 2-D, 3-D or 4-D, got shapes {} and "
                         "{}".format(tuple(src.shape), tuple(dst.shape)))
    form = forms[src.ndim]
    if axes is not None and tuple(int(a) for a in axes) != form:
        raise make_error("BadArgument", "dma_transpose: a {}-D transpose needs axes={}, got {!r}".format(
            src.ndim, form, axes))
    want = tuple(src.shape[a] for a in form)
    if tuple(dst.shape) != want:
        raise make_error("ShapeMismatch", "dma_transpose: src is {} so dst must be {}, got {}".format(
            tuple(src.shape), want, tuple(dst.shape)))
    if dst.dtype != src.dtype:
        raise make_error("BadDtype", "dma_transpose: src and dst dtypes differ ({} vs {})".format(
            src.dtype, dst.dtype))
    if dst.buffer not in _tr.ON_CHIP and _user_call():  # nki-api.md 2.2: accepted, with a warning
        warnings.warn("nisa.dma_transpose: dst is in HBM; the NKI 0.6 signature takes an SBUF dst (the 0.4 "
                      "migration notes show a shared_hbm one); nsim runs it (nki-api.md 2.2)", _tr.NkiWarning,
                      stacklevel=3)
    eng = _dge_trigger(dge_mode, None, dst, src, "dma_transpose")
    if eng == "scalar":  # the hwdge path's shape rules (nki-api.md 2.1)
        lead, inner = int(src.shape[0]), int(src.shape[-1])
        ok = np.dtype(src.dtype).itemsize == 2 and inner <= 128 and (
            lead == 16 if src.ndim == 2 else lead in (1, 2, 4, 8, 16) and lead * int(src.shape[-2]) % 16 == 0)
        if not ok:
            raise make_error("BadArgument", "dma_transpose: dge_mode=hwdge needs a 2-byte dtype, src.shape[-1] <= 128 "
                             "and src.shape[0] == 16 (2-D) or in (1, 2, 4, 8, 16) with src.shape[0] * "
                             "src.shape[-2] a multiple of 16 (3-D / 4-D), got {} {}".format(tuple(src.shape),
                                                                                            np.dtype(src.dtype)))
    middle = int(np.prod(src.shape[1:-1], dtype=np.int64))
    return _op("dma_transpose", engine=eng, dst=dst, src=src, iimm=[middle] if src.ndim > 2 else None)


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None, **kwargs):
    _t(dst, "dst", "iota")
    iimm = _pattern_iimm(pattern, offset, channel_multiplier, "iota")
    p = dst.shape[0]
    if _npat(pattern) != dst.size // p:
        raise make_error("ElementCountMismatch", "iota: pattern {} covers {} elements but dst has {} per "
                         "partition".format(pattern, _npat(pattern), dst.size // p))
    return _op("iota", dst=dst, iimm=iimm)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None,
                         **kwargs):
    _t(dst, "dst", "scalar_tensor_tensor")
    _t(data, "data", "scalar_tensor_tensor")
    _t(operand1, "operand1", "scalar_tensor_tensor")
    fields, imm, flags = {}, {}, []
    _scalar_or_vector(operand0, "operand0", "scalar_tensor_tensor", 0, fields, imm, flags, "has_imm0")
    if reverse0:
        flags.append("reverse0")
    if reverse1:
        flags.append("reverse1")
    return _op("scalar_tensor_tensor", dst=dst, data=data, operand0=fields.get("operand0"), operand1=operand1,
               alu0=_arith_op(op0, "op0", "scalar_tensor_tensor"), alu1=_arith_op(op1, "op1", "scalar_tensor_tensor"),
               flags=flags, imm=_immlist(imm))


def activation_reduce(dst, op, data, reduce_op, reduce_res=None, bias=None, scale=1.0, name=None, **kwargs):
    _t(dst, "dst", "activation_reduce")
    _t(data, "data", "activation_reduce")
    imm, fields = _bias_scale(bias, scale, "activation_reduce")
    rop = _nl.alu_name(reduce_op, "reduce_op")
    if rop not in _isa.ALU_SETS["activation_reduce.reduce_op"]:
        raise make_error("BadArgument", "activation_reduce: reduce_op must be nl.add (or "
                         "nl.maximum / nl.minimum), got nl.{}".format(rop))
    if reduce_res is not None:
        fields["reduce_res"] = _t(reduce_res, "reduce_res", "activation_reduce")
    return _op("activation_reduce", dst=dst, data=data, act=_nl.act_name(op), alu1=rop,
               imm=_immlist(imm), **fields)


_CMP = tuple(n for n in _isa.ALU_OPS if n in _isa.alu_of_class("compare"))  # isa/alu_ops.def class compare


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=None, offset=0,
                  name=None, **kwargs):
    _t(dst, "dst", "affine_select")
    if not isinstance(on_true_tile, NkiTensor) and isinstance(on_false_value, NkiTensor):
        # the 0.2 order: (dst, pattern, offset, channel_multiplier, on_true, on_false)
        offset, channel_multiplier, on_true_tile, on_false_value, cmp_op = (
            channel_multiplier, on_true_tile, on_false_value, cmp_op, None)
    _t(on_true_tile, "on_true_tile", "affine_select")
    if not _is_scalar(on_false_value):
        raise make_error("BadOperandKind", "affine_select: on_false_value must be a scalar, got "
                         "{!r}".format(on_false_value))
    cmp = _nl.alu_name(cmp_op if cmp_op is not None else "equal", "cmp_op")
    if cmp not in _CMP:
        raise make_error("BadArgument", "affine_select: cmp_op must be a comparison ({}), got "
                         "nl.{}".format(", ".join(_CMP), cmp))
    iimm = _pattern_iimm(pattern, offset, channel_multiplier, "affine_select")
    p = dst.shape[0]
    if _npat(pattern) != dst.size // p:
        raise make_error("ElementCountMismatch", "affine_select: pattern {} covers {} elements but dst has "
                         "{} per partition".format(pattern, _npat(pattern), dst.size // p))
    return _op("affine_select", dst=dst, on_true=on_true_tile, alu0=cmp, iimm=iimm,
               imm=[_fimm(on_false_value)])


def nc_stream_shuffle(dst, src, shuffle_mask, name=None, **kwargs):
    _t(dst, "dst", "nc_stream_shuffle")
    _t(src, "src", "nc_stream_shuffle")
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32 or any(m < 0 or m > 255 or (31 < m < 255) for m in mask):  # nki-api.md 2.2: 32 ints
        raise make_error("BadOperandKind", "nc_stream_shuffle: shuffle_mask must be 32 values in 0..31 or 255 "
                         "(keep), got {!r}".format(shuffle_mask))
    return _op("nc_stream_shuffle", dst=dst, src=src, shuffle=mask)


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None,
                       **kwargs):
    _t(dst, "dst", "tensor_tensor_scan")
    _t(data0, "data0", "tensor_tensor_scan")
    _t(data1, "data1", "tensor_tensor_scan")
    fields, imm, flags = {}, {}, []
    _scalar_or_vector(initial, "initial", "tensor_tensor_scan", 0, fields, imm)
    if reverse0:
        flags.append("reverse0")
    if reverse1:
        flags.append("reverse1")
    return _op("tensor_tensor_scan", dst=dst, data0=data0, data1=data1, initial=fields.get("initial"),
               alu0=_arith_op(op0, "op0", "tensor_tensor_scan"), alu1=_arith_op(op1, "op1", "tensor_tensor_scan"),
               flags=flags, imm=_immlist(imm))


_BITVEC = _isa.alu_of_class("bitvec")  # isa/alu_ops.def class bitvec


def _arith_op(op, what, fn):
    """The ALU name of ``op`` for an instruction that takes arithmetic ops only (spec §2.2: the scan and
    scalar_tensor_tensor compute in fp32; a bit-vector op there is a kernel mistake, not a bit pattern)."""
    name = _nl.alu_name(op, what)
    if name in _BITVEC:
        raise make_error("BadArgument", "nisa.{}: {} must be an arithmetic op (add, multiply, maximum, ...), got "
                         "the bit-vector op nl.{}; use nisa.tensor_tensor / tensor_scalar for bitwise "
                         "ops".format(fn, what, name))
    return name


_REDUCE_OPS = _isa.ALU_SETS["tensor_scalar_reduce.reduce_op"]


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None,
                         **kwargs):
    return _tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res, reverse0, reduce_cmd, reduce_init,
                                 reduce_res_negate)


def _tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                          reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, beta1=False):
    """tensor_scalar_reduce; ``beta1``: the Beta-1 form, which also takes reduce_op=subtract."""
    _t(dst, "dst", "tensor_scalar_reduce")
    _t(data, "data", "tensor_scalar_reduce")
    fields, imm, flags = {}, {}, []
    _scalar_or_vector(operand0, "operand0", "tensor_scalar_reduce", 0, fields, imm, flags, "has_imm0")
    rop = _nl.alu_name(reduce_op, "reduce_op")
    # nki-api.md 2.2: reduce_op is add, multiply, maximum or minimum; Beta 1 also takes subtract.
    if rop not in _REDUCE_OPS or (rop == "subtract" and not beta1):
        raise make_error("BadArgument", "tensor_scalar_reduce: reduce_op must be add, multiply, "
                         "maximum or minimum, got nl.{}".format(rop))
    cmd = _rcmd(reduce_cmd)
    if cmd == "load_reduce" and reduce_init is None:
        raise make_error("MissingOperand", "tensor_scalar_reduce: reduce_cmd=load_reduce needs "
                         "reduce_init")
    _scalar_or_vector(reduce_init, "reduce_init", "tensor_scalar_reduce", 1, fields, imm)
    if reduce_res is not None:
        fields["reduce_res"] = _t(reduce_res, "reduce_res", "tensor_scalar_reduce")
    if reverse0:
        flags.append("reverse0")
    if reduce_res_negate:
        flags.append("negate")
    return _op("tensor_scalar_reduce", dst=dst, data=data, operand0=fields.get("operand0"),
               reduce_res=fields.get("reduce_res"), reduce_init=fields.get("reduce_init"),
               alu0=_nl.alu_name(op0, "op0"), alu1=rop, reduce_cmd=cmd, flags=flags, imm=_immlist(imm))


def bn_stats(dst, data, name=None, **kwargs):
    _t(dst, "dst", "bn_stats")
    _t(data, "data", "bn_stats")
    fmax = int(_nl.tile_size.bn_stats_fmax)
    per_partition = data.size // max(1, data.shape[0])
    if per_partition > fmax:  # nki-api.md 2.2: "<= 512 = tile_size.bn_stats_fmax"
        raise make_error("ElementCountMismatch", "bn_stats: data has {} elements per partition, at most {} "
                         "(nl.tile_size.bn_stats_fmax; split the row and combine the stats with bn_aggr)".format(
                             per_partition, fmax))
    return _op("bn_stats", dst=dst, data=data)


def bn_aggr(dst, data, name=None, **kwargs):
    _t(dst, "dst", "bn_aggr")
    _t(data, "data", "bn_aggr")
    return _op("bn_aggr", dst=dst, data=data)


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None, **kwargs):
    _t(dst, "dst", "tensor_copy_predicated")
    _t(predicate, "predicate", "tensor_copy_predicated")
    fields, imm, flags = {}, {}, []
    if _is_scalar(src):
        imm[0] = src
        flags.append("has_imm0")
    else:
        fields["src"] = _t(src, "src", "tensor_copy_predicated")
    if reverse_pred:
        flags.append("reverse_pred")
    return _op("tensor_copy_predicated", dst=dst, src=fields.get("src"), predicate=predicate, flags=flags,
               imm=_immlist(imm), iimm=_int_iimm(imm) if np.issubdtype(dst.dtype, np.integer) else None)


def _vector_operand(x, like, what, slot):
    """A (P,1) fp32 operand: tensors pass through; a scalar is materialised with memset."""
    if isinstance(x, NkiTensor):
        return x
    if not _is_scalar(x):
        raise make_error("BadOperandKind", "{}: {} must be a (P, 1) tensor or a scalar, got {!r}".format(
            what, slot, x))
    t = _tr.current("nisa." + what).tile("sbuf", np.float32, (like.shape[0], 1))
    memset(t, float(x))
    return t


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.reset_reduce,
                 reduce_res=None, reduce_op=None, range_start=0, on_false_value=FP32_MIN, name=None, **kwargs):
    _t(dst, "dst", "range_select")
    _t(on_true_tile, "on_true_tile", "range_select")
    if reduce_op is not None and _nl.alu_name(reduce_op, "reduce_op") != "maximum":
        raise make_error("BadArgument", "range_select: reduce_op must be nl.maximum")
    c0, c1 = _nl.alu_name(comp_op0, "comp_op0"), _nl.alu_name(comp_op1, "comp_op1")
    for c in (c0, c1):
        if c not in _CMP or c == "not_equal":  # nki-api.md 2.2: equal, less, less_equal, greater, greater_equal
            raise make_error("BadArgument", "range_select: comp_op must be equal, less, less_equal, greater or "
                             "greater_equal, got nl.{}".format(c))
    if float(on_false_value) != float(FP32_MIN):  # nki-api.md 2.2: "on_false_value ... must be FP32_MIN"
        raise make_error("BadArgument", "range_select: on_false_value must be nl.fp32.min ({}), got {!r}".format(
            FP32_MIN, on_false_value))
    b0 = _vector_operand(bound0, dst, "range_select", "bound0")
    b1 = _vector_operand(bound1, dst, "range_select", "bound1")
    if reduce_res is not None:
        _t(reduce_res, "reduce_res", "range_select")
    return _op("range_select", dst=dst, on_true=on_true_tile, bound0=b0, bound1=b1, reduce_res=reduce_res,
               alu0=c0, alu1=c1, reduce_cmd=_rcmd(reduce_cmd),
               imm=[_fimm(range_start), _fimm(on_false_value)])


# --------------------------------------------------------------------------------------------------
# Tier 3 (§2.3) and §2.4
# --------------------------------------------------------------------------------------------------

_TOP8_MIN, _TOP8_MAX = 8, 16384


def _pe(x):
    """Elements per partition of a view."""
    return int(x.size // x.shape[0]) if x.shape[0] else 0


def _top8_src(x, slot, what, lo=_TOP8_MIN):
    n = _pe(x)
    if not lo <= n <= _TOP8_MAX:
        raise make_error("ElementCountMismatch", "{}: {} needs {} to {} elements per partition, got {}".format(
            what, slot, lo, _TOP8_MAX, n))


def _eight(x, slot, what):
    if _pe(x) != 8:
        raise make_error("ElementCountMismatch", "{}: {} needs 8 elements per partition, got shape {}".format(
            what, slot, tuple(x.shape)))


def max8(dst, src, name=None, **kwargs):
    """``dst[p, :8]`` = the 8 largest values of the flattened ``src[p]``, descending (duplicates kept)."""
    _t(dst, "dst", "max8")
    _t(src, "src", "max8")
    _top8_src(src, "src", "max8")
    _eight(dst, "dst", "max8")
    return _op("max8", dst=dst, src=src)


def nc_find_index8(dst, data, vals, name=None, **kwargs):
    """``dst[p, i]`` = index of the first not yet taken ``vals[p, i]`` in the flattened ``data[p]``
    (not found: all ones)."""
    _t(dst, "dst", "nc_find_index8")
    _t(data, "data", "nc_find_index8")
    _t(vals, "vals", "nc_find_index8")
    _top8_src(data, "data", "nc_find_index8")
    _eight(vals, "vals", "nc_find_index8")
    _eight(dst, "dst", "nc_find_index8")
    if np.dtype(dst.dtype) not in (np.dtype(np.uint32), np.dtype(np.uint16)):
        raise make_error("BadDtype", "nc_find_index8: dst must be uint32 or uint16, got {}".format(
            np.dtype(dst.dtype)))
    return _op("nc_find_index8", dst=dst, data=data, vals=vals)


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None, **kwargs):
    """``dst = data`` with, for i = 7 down to 0, the first element equal to ``vals[p, i]`` replaced by
    ``imm`` (its index into ``dst_idx[p, i]``)."""
    _t(dst, "dst", "nc_match_replace8")
    _t(data, "data", "nc_match_replace8")
    _t(vals, "vals", "nc_match_replace8")
    _top8_src(data, "data", "nc_match_replace8", lo=1)
    _eight(vals, "vals", "nc_match_replace8")
    if not _is_scalar(imm):
        raise make_error("BadOperandKind", "nc_match_replace8: imm must be a scalar, got {!r}".format(imm))
    if dst_idx is not None:
        _t(dst_idx, "dst_idx", "nc_match_replace8")
        _eight(dst_idx, "dst_idx", "nc_match_replace8")
    return _op("nc_match_replace8", dst=dst, data=data, vals=vals, dst_idx=dst_idx, imm=[_fimm(imm)])


_PART_REDUCE = _isa.ALU_SETS["tensor_partition_reduce.op"]


def tensor_partition_reduce(dst, op, data, name=None, **kwargs):
    """``dst[0, f...] = op`` over the partitions of ``data[:, f...]`` (GpSimd)."""
    _t(dst, "dst", "tensor_partition_reduce")
    _t(data, "data", "tensor_partition_reduce")
    o = _nl.alu_name(op)
    if o not in _PART_REDUCE:
        raise make_error("BadArgument", "tensor_partition_reduce: op must be one of {}, got nl.{}".format(
            ", ".join(_PART_REDUCE), o))
    return _op("tensor_partition_reduce", dst=dst, data=data, alu0=o)


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                  reduce_op=None, reverse_pred=False, name=None, **kwargs):
    """``dst = where((predicate != 0) != reverse_pred, on_true, on_false)``; optional max-reduction of the
    row through the VectorE registers into ``reduce_res``."""
    _t(dst, "dst", "select_reduce")
    _t(predicate, "predicate", "select_reduce")
    _t(on_true, "on_true", "select_reduce")
    fields, imm, flags = {}, {}, []
    _scalar_or_vector(on_false, "on_false", "select_reduce", 0, fields, imm, flags, "has_imm0")
    rop = _nl.alu_name(reduce_op if reduce_op is not None else "maximum", "reduce_op")
    if rop not in _isa.ALU_SETS["select_reduce.reduce_op"]:
        raise make_error("BadArgument", "select_reduce: reduce_op must be nl.maximum, got nl.{}".format(
            rop))
    if reduce_res is not None:
        _t(reduce_res, "reduce_res", "select_reduce")
    if reverse_pred:
        flags.append("reverse_pred")
    return _op("select_reduce", dst=dst, predicate=predicate, on_true=on_true, on_false=fields.get("on_false"),
               reduce_res=reduce_res, alu1=rop if rop != "maximum" else None, reduce_cmd=_rcmd(reduce_cmd),
               flags=flags, imm=_immlist(imm))


_CUMUL_OPS = _isa.ALU_SETS["tensor_scalar_cumulative.op1"]


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None,
                             **kwargs):
    """Scan through the VectorE registers: ``reg = op1(op0(src[i], imm0), reg); dst[i] = reg``."""
    _t(dst, "dst", "tensor_scalar_cumulative")
    _t(src, "src", "tensor_scalar_cumulative")
    fields, imm, flags = {}, {}, []
    _scalar_or_vector(imm0, "operand0", "tensor_scalar_cumulative", 0, fields, imm, flags, "has_imm0")
    o1 = _nl.alu_name(op1, "op1")
    if o1 not in _CUMUL_OPS:
        raise make_error("BadArgument", "tensor_scalar_cumulative: op1 must be one of {}, got "
                         "nl.{}".format(", ".join(_CUMUL_OPS), o1))
    cmd = _rcmd(reduce_cmd)
    if cmd == "load_reduce" and imm1 is None:
        raise make_error("MissingOperand", "tensor_scalar_cumulative: reduce_cmd=load_reduce needs imm1")
    _scalar_or_vector(imm1, "reduce_init", "tensor_scalar_cumulative", 1, fields, imm)
    for x, slot in ((dst, "dst"), (src, "src")):
        if np.dtype(x.dtype) in (np.dtype(np.int32), np.dtype(np.uint32)):
            raise make_error("BadDtype", "tensor_scalar_cumulative: {} may not be {}".format(
                slot, np.dtype(x.dtype)))
    return _op("tensor_scalar_cumulative", dst=dst, src=src, operand0=fields.get("operand0"),
               reduce_init=fields.get("reduce_init"), alu0=_nl.alu_name(op0, "op0"), alu1=o1, reduce_cmd=cmd,
               flags=flags, imm=_immlist(imm))


def sequence_bounds(dst, segment_ids, name=None, **kwargs):
    """``segment_ids (1, n)`` -> ``dst (1, 2, n)``: start / end (exclusive) of each element's run of equal
    ids; id 0 (padding) -> (n, -1)."""
    _t(dst, "dst", "sequence_bounds")
    _t(segment_ids, "segment_ids", "sequence_bounds")
    if segment_ids.shape[0] != 1 or dst.shape[0] != 1:
        raise make_error("PartitionMismatch", "sequence_bounds: segment_ids and dst need 1 partition, got "
                         "shapes {} and {}".format(tuple(segment_ids.shape), tuple(dst.shape)))
    n = _pe(segment_ids)
    if _pe(dst) != 2 * n:
        raise make_error("ElementCountMismatch", "sequence_bounds: dst must be (1, 2, {}), got {}".format(
            n, tuple(dst.shape)))
    return _op("sequence_bounds", dst=dst, segment_ids=segment_ids)


def nc_n_gather(dst, data, indices, name=None, **kwargs):
    """``dst[p, j] = data_flat[p, indices[p, j]]`` (GpSimd; dst dtype = data dtype)."""
    _t(dst, "dst", "nc_n_gather")
    _t(data, "data", "nc_n_gather")
    _t(indices, "indices", "nc_n_gather")
    return _op("nc_n_gather", dst=dst, data=data, indices=indices)


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None, **kwargs):
    """Per group of 16 partitions: gather ``num_elem_per_idx`` elements of each partition's ``src_buffer``
    at the group's indices (column-major over the group's ``index`` rows)."""
    _t(dst, "dst", "local_gather")
    _t(src_buffer, "src_buffer", "local_gather")
    _t(index, "index", "local_gather")
    e = int(num_elem_per_idx)
    if e not in (1, 2, 4, 8, 16, 32):
        raise make_error("BadArgument", "local_gather: num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, "
                         "got {}".format(num_elem_per_idx))
    if src_buffer.shape[0] != index.shape[0] or src_buffer.shape[0] % 16:
        raise make_error("PartitionMismatch", "local_gather: src_buffer and index need the same partition "
                         "count, a multiple of 16 (got {} and {})".format(src_buffer.shape[0], index.shape[0]))
    nall = 16 * _pe(index)
    nv = nall if num_valid_indices is None else int(num_valid_indices)
    if not 1 <= nv <= min(nall, 4096):
        raise make_error("BadArgument", "local_gather: num_valid_indices {} must be in [1, {}]".format(
            nv, min(nall, 4096)))
    return _op("local_gather", dst=dst, src_buffer=src_buffer, index=index, iimm=[e, 0 if nv == nall else nv])


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None, **kwargs):
    """Partitions 0, 16, ..., 112 only: ``dst[p, :T]`` = indices (+ ``index_offset``) of the nonzero
    ``src[p, :]`` then ``padding_val``; ``dst[p, T]`` = their count (gen3+, GpSimd)."""
    _t(dst, "dst", "nonzero_with_count")
    _t(src, "src", "nonzero_with_count")
    if get_nc_version() < nc_version.gen3:
        raise make_error("NotOnGeneration", "nonzero_with_count needs gen3 or later (nc_version {})".format(
            int(get_nc_version())))
    if np.dtype(dst.dtype) != np.dtype(np.int32):
        raise make_error("BadDtype", "nonzero_with_count: dst must be int32, got {}".format(
            np.dtype(dst.dtype)))
    if np.dtype(src.dtype) not in (np.dtype(np.int32), np.dtype(np.float32)):
        raise make_error("BadDtype", "nonzero_with_count: src must be float32 or int32, got "
                         "{}".format(np.dtype(src.dtype)))
    if _pe(dst) != _pe(src) + 1:
        raise make_error("ElementCountMismatch", "nonzero_with_count: dst needs {} elements per partition "
                         "(src's + 1), got {}".format(_pe(src) + 1, _pe(dst)))
    return _op("nonzero_with_count", dst=dst, src=src, iimm=[int(index_offset), int(padding_val)])


def topk(val_dst, idx_dst, src, n, name=None, **kwargs):
    """GpSimd top-K: ``src`` (bfloat16) holds one vector of ``n`` elements per group of 16 partitions in
    "snake" order (element e at partition 16 g + e % 16, column e // 16); the K largest (K = ``val_dst``'s
    free size) are written in ascending order to partition 16 g of ``val_dst`` (bfloat16) and their element
    indices to ``idx_dst`` (uint32); the other partitions are left untouched. NaN counts as the largest
    value; equal values: the lower index first (nsim's decisions, docs/nki-coverage.md)."""
    _t(val_dst, "val_dst", "topk")
    _t(idx_dst, "idx_dst", "topk")
    _t(src, "src", "topk")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise make_error("BadArgument", "topk: n must be an int, got {!r}".format(n))
    return _op("topk", dst=val_dst, dst_idx=idx_dst, src=src, iimm=[int(n)])


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_init=0.0, name=None,
                **kwargs):
    """gen4 (VectorE): ``dst = exp(src - max_value)`` (max_value a scalar or a (P, 1) tensor); optional
    running sum in the VectorE registers into ``reduce_res`` (reset 0, load_reduce ``reduce_init``)."""
    _t(dst, "dst", "exponential")
    _t(src, "src", "exponential")
    fields, imm, flags = {}, {}, []
    _scalar_or_vector(max_value, "operand0", "exponential", 0, fields, imm, flags, "has_imm0")
    _scalar_or_vector(reduce_init, "reduce_init", "exponential", 1, fields, imm)
    if reduce_res is not None:
        _t(reduce_res, "reduce_res", "exponential")
    return _op("exponential", dst=dst, src=src, operand0=fields.get("operand0"), reduce_res=reduce_res,
               reduce_init=fields.get("reduce_init"), reduce_cmd=_rcmd(reduce_cmd), flags=flags, imm=_immlist(imm))


# (op0, op1): (multiply, one of activate2.op1 after multiply) or (one of activate2.op0 before bypass, bypass)
_ACT2_PAIRS = ({("multiply", b) for b in _isa.ALU_SETS["activate2.op1 after multiply"]} |
               {(a, "bypass") for a in _isa.ALU_SETS["activate2.op0 before bypass"]})
_ACT2_REDUCE = _isa.ALU_SETS["activate2.reduce_op"]


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=reduce_cmd.idle, name=None, **kwargs):
    """gen4 (ScalarE): ``dst = op(op1(op0(data, imm0), imm1))`` (imm0/imm1 scalars or (P, 1) tensors;
    reverse flags swap each stage's operands); optional reduction into the ScalarE registers."""
    _t(dst, "dst", "activate2")
    _t(data, "data", "activate2")
    o0 = _nl.alu_name(op0 if op0 is not None else "bypass", "op0")
    o1 = _nl.alu_name(op1 if op1 is not None else "bypass", "op1")
    if (o0, o1) not in _ACT2_PAIRS:
        raise make_error("BadArgument", "activate2: (op0, op1) = (nl.{}, nl.{}) is not one of {}".format(
            o0, o1, sorted(_ACT2_PAIRS)))
    fields, imm, flags = {}, {}, []
    if o0 != "bypass":
        _scalar_or_vector(imm0, "operand0", "activate2", 0, fields, imm, flags, "has_imm0")
    if o1 != "bypass":
        _scalar_or_vector(imm1, "operand1", "activate2", 1, fields, imm, flags, "has_imm1")
    if not _is_scalar(relu_param):
        raise make_error("BadOperandKind", "activate2: relu_param must be a scalar")
    if float(relu_param) != 0.0:
        imm[3] = relu_param
    rop = None
    if reduce_op is not None:
        rop = _nl.alu_name(reduce_op, "reduce_op")
        if rop not in _ACT2_REDUCE:
            raise make_error("BadArgument", "activate2: reduce_op must be one of {}, got nl.{}".format(
                ", ".join(_ACT2_REDUCE), rop))
    if reduce_res is not None:
        _t(reduce_res, "reduce_res", "activate2")
    if reverse0:
        flags.append("reverse0")
    if reverse1:
        flags.append("reverse1")
    iimm = None
    if rop is not None:
        iimm = [_isa.ALU_OPS.index(rop)]
    return _op("activate2", dst=dst, data=data, operand0=fields.get("operand0"), operand1=fields.get("operand1"),
               reduce_res=reduce_res, act=_nl.act_name(op), alu0=o0 if o0 != "bypass" else None,
               alu1=o1 if o1 != "bypass" else None, reduce_cmd=_rcmd(reduce_cmd), flags=flags, imm=_immlist(imm),
               iimm=iimm)


def quantize_mx(dst, src, dst_scale, name=None):
    """gen4 (VectorE): MX-quantize ``src`` [P, F] (float16/bfloat16, P a multiple of 32, F of 4) into ``dst``
    [P, F/4] (``float8_e5m2_x4`` / ``float8_e4m3fn_x4``) and the group scales into ``dst_scale`` (uint8 or
    ``float8_e8m0fnu``, F/4 per partition). A group is 8 partitions x 4 consecutive elements; its scale byte
    goes to row ``(g // 4) * 32 + g % 4`` of the ``dst_scale`` view, which may start at a quadrant start plus
    0, 4, 8 or 12 (docs/isa.md "MX")."""
    _t(dst, "dst", "quantize_mx")
    _t(src, "src", "quantize_mx")
    _t(dst_scale, "dst_scale", "quantize_mx")
    return _op("quantize_mx", dst=dst, src=src, dst_scale=dst_scale)


_MX_ROW_TILES = (32, 64, 128)  # nki-api.md 2.1 PE tiling sizes (rows); nc_matmul_mx tiles rows only


def _mx_tiling(tile_position, tile_size, stationary):
    """nc_matmul_mx PE tiling (row tiling only; no functional effect): both empty or both (row, col) pairs,
    rows 32/64/128 with the position a multiple below 128, the full column width at column 0, K <= rows."""
    pos = tuple(tile_position) if tile_position else ()
    size = tuple(tile_size) if tile_size else ()
    if not pos and not size:
        return
    cols = int(_isa.limits(*_nl._configured())["pe_cols"])
    if len(pos) != 2 or len(size) != 2:
        raise make_error("BadArgument", "nc_matmul_mx: tile_position and tile_size must both be (row, column) "
                         "pairs or both be omitted, got {!r} and {!r}".format(tile_position, tile_size))
    r, c = (int(x) for x in pos)
    rs, cs = (int(x) for x in size)
    if rs not in _MX_ROW_TILES or r % rs or not 0 <= r < 128:
        raise make_error("BadArgument", "nc_matmul_mx: tile_size rows must be one of {} and tile_position's row a "
                         "multiple of it below 128, got size {} at row {}".format(_MX_ROW_TILES, rs, r))
    if c != 0 or cs != cols:
        raise make_error("BadArgument", "nc_matmul_mx tiles rows only: tile_position's column must be 0 and "
                         "tile_size's column size {}, got {} and {}".format(cols, c, cs))
    if stationary.shape[0] > rs:
        raise make_error("BadArgument", "nc_matmul_mx: K = {} packed rows exceed the {}-row tile".format(
            stationary.shape[0], rs))


def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None, tile_size=None,
                 accumulate=None, name=None):
    """gen4 (TensorE): ``dst[m, n] = sum_k sum_q st[k, m, q] 2^(ss[k/8, m] - 127) mv[k, n, q] 2^(ms[k/8, n] - 127)``
    for x4-packed ``stationary`` [K, M] and ``moving`` [K, N] (float8_e5m2_x4 / float8_e4m3fn_x4 /
    float4_e2m1fn_x4; K a multiple of 32 up to 128 packed rows = 512 values, M even <= 128), scales laid out as
    quantize_mx writes them, into PSUM ``dst`` [M, N] (float32 or bfloat16); ``accumulate`` as nc_matmul."""
    _t(dst, "dst", "nc_matmul_mx")
    _t(stationary, "stationary", "nc_matmul_mx")
    _t(moving, "moving", "nc_matmul_mx")
    _t(stationary_scale, "stationary_scale", "nc_matmul_mx")
    _t(moving_scale, "moving_scale", "nc_matmul_mx")
    _mx_tiling(tile_position, tile_size, stationary)
    tr = _tr.current("nisa.nc_matmul_mx")
    flags = ["accumulate"] if tr.matmul_accumulates(dst, accumulate) else []
    return _op("nc_matmul_mx", dst=dst, stationary=stationary, moving=moving, stationary_scale=stationary_scale,
               moving_scale=moving_scale, flags=flags, iimm=_pe_tile(tile_position, tile_size, "nc_matmul_mx"))


def rand2(dst, min, max, name=None, **kwargs):  # noqa: A002 - the NKI parameter names
    """gen4: uniform floats in ``[min, max)`` (scalars) from nsim's deterministic seeded PRNG."""
    _t(dst, "dst", "rand2")
    if not (_is_scalar(min) and _is_scalar(max)):
        raise make_error("NotSupported", "rand2: nsim supports scalar min and max only, got {!r} and "
                         "{!r}".format(min, max))
    if not float(min) <= float(max):
        raise make_error("BadArgument", "rand2: min {} must not exceed max {}".format(min, max))
    # VectorE (its PRNG stream) named explicitly: an unnamed engine let the scheduler's automatic placement move
    # rand2 to GpSimd, whose stream differs (rand_get_state / rand_set_state(engine=vector) did not replay it)
    return _op("rand2", dst=dst, imm=[_fimm(min), _fimm(max)], engine=_rng_engine(None, "rand2"))


def dropout(dst, data, prob, name=None, **kwargs):
    """``dst = 0`` with probability ``prob`` (a scalar or a (P, 1) tensor) else ``data``; no rescaling. The
    random numbers come from nsim's deterministic seeded PRNG (``set_rng_seed``), not hardware's."""
    _t(dst, "dst", "dropout")
    _t(data, "data", "dropout")
    fields, imm, flags = {}, {}, []
    if _is_scalar(prob) and not 0.0 <= float(prob) <= 1.0:
        raise make_error("BadArgument", "dropout: prob must be in [0, 1], got {}".format(prob))
    _scalar_or_vector(prob, "operand0", "dropout", 0, fields, imm, flags, "has_imm0")
    return _op("dropout", dst=dst, data=data, operand0=fields.get("operand0"), flags=flags, imm=_immlist(imm))


def _rng_engine(e, what):
    return _engine(e, what) or _isa.DEFAULT_ENGINE[what]


def rng(dst, engine=engine.vector, name=None, **kwargs):
    """32 random bits per element of the integer ``dst`` (truncated to its width), from the engine's
    deterministic PRNG stream."""
    _t(dst, "dst", "rng")
    if not np.issubdtype(np.dtype(dst.dtype), np.integer):
        raise make_error("BadDtype", "rng: dst must have an integer dtype, got {}".format(
            np.dtype(dst.dtype)))
    return _op("rng", dst=dst, engine=_rng_engine(engine, "rng"))


def set_rng_seed(src_seeds, name=None, **kwargs):
    """Seed the VectorE and GpSimd PRNG streams from the integer tensor ``src_seeds``."""
    _t(src_seeds, "src_seeds", "set_rng_seed")
    return _op("set_rng_seed", src_seeds=src_seeds)


def rand_set_state(src_seeds, engine=engine.gpsimd, name=None, **kwargs):
    """Restore an engine's PRNG state saved by ``rand_get_state`` (uint32 elements 0 and 1 of partition 0)."""
    _t(src_seeds, "src_seeds", "rand_set_state")
    return _op("rand_set_state", src_seeds=src_seeds, engine=_rng_engine(engine, "rand_set_state"))


def rand_get_state(dst, engine=engine.gpsimd, name=None, **kwargs):
    """Write an engine's PRNG state into the integer ``dst`` (each partition: low, high 32 bits, zeros)."""
    _t(dst, "dst", "rand_get_state")
    return _op("rand_get_state", dst=dst, engine=_rng_engine(engine, "rand_get_state"))


# --------------------------------------------------------------------------------------------------
# LNC=2: two physical cores (docs/lnc.md)
# --------------------------------------------------------------------------------------------------


def _lnc_core(what):
    """(this core's index, LNC degree) of the kernel being traced; NotSupported under LNC=1."""
    tr = _tr.current("nisa." + what)
    core, n = getattr(tr, "lnc", (0, 1))
    if n < 2:
        raise make_error("LncNotSupported", "nisa.{} needs an LNC=2 launch (kernel[2](...)): with one core there is "
                         "no peer".format(what))
    return core, n


def _rank(r, what, arg):
    r = _tr.int_immediate(r, "{}: {}".format(what, arg))
    if r not in (0, 1):
        raise make_error("BadArgument", "{}: {} must be 0 or 1 (a core of the LNC=2 launch), got {}".format(
            what, arg, r))
    return r


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, name=None, **kwargs):
    """``nisa.sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id)`` (LNC=2): this core's ``src`` goes
    to core ``send_to_rank``'s ``dst``; this core's ``dst`` receives core ``recv_from_rank``'s ``src``. Both
    cores block until the other posts the call with the same ``pipe_id``; timed as an SBUF-to-SBUF DMA."""
    _t(src, "src", "sendrecv")
    _t(dst, "dst", "sendrecv")
    core, _n = _lnc_core("sendrecv")
    send = _rank(send_to_rank, "sendrecv", "send_to_rank")
    recv = _rank(recv_from_rank, "sendrecv", "recv_from_rank")
    if send == core or recv == core:
        raise make_error("BadArgument", "sendrecv: core {} sends to rank {} and receives from rank {}: both must be "
                         "the other core ({})".format(core, send, recv, 1 - core))
    pipe = _tr.int_immediate(pipe_id, "sendrecv: pipe_id")
    if kwargs.get("use_gpsimd_dma"):
        dma_engine = 2
    try:
        de = int(dma_engine)
    except (TypeError, ValueError):
        raise make_error("BadArgument", "sendrecv: dma_engine must be nisa.dma_engine.dma or .gpsimd_dma, got "
                         "{!r}".format(dma_engine))
    if de not in (1, 2):
        raise make_error("BadArgument", "sendrecv: dma_engine must be nisa.dma_engine.dma or .gpsimd_dma, got "
                         "{!r}".format(dma_engine))
    if tuple(src.shape) != tuple(dst.shape) or src.dtype != dst.dtype:
        raise make_error("ShapeMismatch", "sendrecv: src {} {} and dst {} {} must have the same shape and dtype".format(
            tuple(src.shape), src.dtype, tuple(dst.shape), dst.dtype))
    if de == 2:
        per_part = {1: 256, 2: 512}.get(np.dtype(src.dtype).itemsize, 1024)
        free = int(np.prod(src.shape[1:])) if len(src.shape) > 1 else 1
        if free * np.dtype(src.dtype).itemsize > 1024 or free > per_part:
            raise make_error("BadArgument", "sendrecv: gpsimd_dma moves at most 1024 B (32-bit), 512 B (16-bit) or "
                             "256 B (8-bit) per partition; src has {} elements of {} per partition".format(
                                 free, src.dtype))
    _tr.current("nisa.sendrecv").peer_data[dst._flat()[0].name] = "dst of a sendrecv"
    return _op("sendrecv", engine="gpsimd" if de == 2 else "sync", dst=dst, src=src, iimm=[pipe, send, recv])


def core_barrier(data, cores, engine=engine.gpsimd, name=None, **kwargs):
    """``nisa.core_barrier(data, cores=(0, 1), engine=...)`` (LNC=2): the named engine of both cores waits
    until both reach the barrier; ``data`` (the ``shared_hbm`` tensor both cores wrote) holds their
    earlier writes afterwards. Only that engine blocks."""
    _t(data, "data", "core_barrier")
    _lnc_core("core_barrier")
    try:
        cs = tuple(int(c) for c in cores)
    except (TypeError, ValueError):
        raise make_error("BadArgument", "core_barrier: cores must be (0, 1), got {!r}".format(cores))
    if sorted(cs) != [0, 1]:
        raise make_error("BadArgument", "core_barrier: cores must be (0, 1), got {!r}".format(cores))
    if data.buffer != "hbm":
        raise make_error("BadBuffer", "core_barrier: data must be an HBM tensor (the shared_hbm tensor both cores "
                         "wrote), got a {} tensor".format(data.buffer))
    eng = _engine(engine, "core_barrier") or _isa.DEFAULT_ENGINE["core_barrier"]
    _tr.current("nisa.core_barrier").peer_data[data._flat()[0].name] = "data of a core_barrier"
    return _op("core_barrier", engine=eng, dst=data)


# --------------------------------------------------------------------------------------------------
# Keyword checking and name= labels of every instruction (one place: nsim.nki._api)
# --------------------------------------------------------------------------------------------------

from ._unsupported import install as _install_unsupported  # noqa: E402

# --------------------------------------------------------------------------------------------------
# Sequencer registers (evaluated while tracing: nsim.tracer.VirtualRegister)
# --------------------------------------------------------------------------------------------------

VirtualRegister = _tr.VirtualRegister
_REG_MAX = 2 ** 32


def _reg_int(v, what):
    x = _tr.register_value(v, what)
    if not -2 ** 31 <= x < _REG_MAX:
        raise make_error("BadArgument", "{}: {} does not fit a 32-bit register".format(what, x))
    return x


def register_alloc(x=None):
    """A new sequencer register holding ``x`` (an int, default 0)."""
    _tr.current("nisa.register_alloc")
    _tr.concrete_only("nisa.register_alloc")
    return VirtualRegister(0 if x is None else _reg_int(x, "register_alloc(x=)"))


def _dst_reg(dst, what):
    if not isinstance(dst, VirtualRegister):
        raise make_error("BadOperandKind", "{}: dst must be a VirtualRegister, got {!r}".format(what, dst))
    if dst.frozen:
        raise make_error("BadArgument", "{}: a loop's induction register cannot be written".format(what))
    return dst


def register_move(dst, src):
    """``dst = src`` (an int or a register)."""
    _tr.current("nisa.register_move")
    _tr.concrete_only("nisa.register_move")
    d = _dst_reg(dst, "register_move")
    d.value = _reg_int(src, "register_move(src=)")
    d.loads = _tr.register_loads(src)


def _one_element(t, what, slot):
    if not isinstance(t, NkiTensor) or t.size != 1:
        raise make_error("ShapeMismatch", "{}: {} must be a one-element tensor ([1] or [1, 1]), got {!r}".format(
            what, slot, t))
    return t


def register_load(dst, src):
    """``dst = src[0]``: the current value of a one-element HBM/SBUF tensor (the instructions traced so far
    run in the simulator core to produce it; float values are truncated toward zero, as a 32-bit int load).
    Emits the ``register_load`` instruction (a sequencer reading ``src``, after its producer), labelled
    ``register_load#N``: the instructions using the register wait for it (their kernel.json ``"after"``)."""
    tr = _tr.current("nisa.register_load")
    _tr.concrete_only("nisa.register_load")
    _dst_reg(dst, "register_load")
    v = np.asarray(_one_element(src, "register_load", "src").numpy()).reshape(-1)[0]
    value = _reg_int(int(v), "register_load")
    label = "register_load#{}".format(next(tr._reg_loads))
    outer, tr.label = tr.label, label  # (its own label even inside a labelled call: the "after" edges name it)
    try:
        _op("register_load", src=src)
    finally:
        tr.label = outer
    dst.value = value
    dst.loads = (label,)


def register_store(dst, src):
    """``dst[0] = src`` (a register or an int) into a one-element tensor."""
    _tr.current("nisa.register_store")
    _tr.concrete_only("nisa.register_store")
    _one_element(dst, "register_store", "dst")
    v = _reg_int(src, "register_store(src=)")
    tr = _tr.active()
    outer = tr.reg_after
    tr.reg_after = tuple(dict.fromkeys(outer + _tr.register_loads(src)))  # the value is there after its load
    try:
        if dst.buffer == "hbm":
            t = _nl.ndarray((1, 1), dtype=dst.dtype, buffer=_nl.sbuf)
            memset(t, v)
            return dma_copy(dst, t)
        return memset(dst, v)
    finally:
        tr.reg_after = outer


_install_unsupported(globals(), 'nki.isa', {})

from ._api import publish as _publish  # noqa: E402

_publish(globals(), "nki.isa", isa=True, extra={"dma_copy": ("dst_rmw_op",), "sendrecv": ("use_gpsimd_dma",)},
         exclude=("get_nc_version", "get_nc_sub_version"), twins="nsim.nki.beta1.isa")
