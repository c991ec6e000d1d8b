"""The ISA and configuration facts the Python frontends use, read from the C++ tables through ``_nsim`` and
never retyped: opcodes with their slots, roles and engines (isa/opcodes.def, OP and MACRO rows), ALU operators
and their classes (isa/alu_ops.def), activation functions (isa/act_funcs.def), dtypes (isa/dtypes.def),
instruction flags and default immediates (isa/flags.def, isa/isa.h), the configuration parameters
(engines/params.def) and the limits of a configured core. ``tests/python/test_isa_tables.py`` checks that
every Python-visible set equals the ``_nsim`` one.

The tables load on first use (attribute access on this module), so ``import nsim`` works without the
extension; tracing a kernel needs it.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List

__all__ = ["limits", "config_values", "alu_of_class", "alu_of_arity", "matmul_dtype_rule"]


def _ext():
    try:  # installed package
        from nsim import _nsim  # type: ignore[attr-defined]
    except ImportError:  # build tree: build/python/_nsim*.so on sys.path
        try:
            import _nsim  # type: ignore[no-redef]
        except ImportError as e:  # pragma: no cover - depends on the build
            raise ImportError("nsim: the ISA tables come from the _nsim extension, which is not built "
                              "(cmake --build build; PYTHONPATH=python:build/python)") from e
    return _nsim


@functools.lru_cache(maxsize=None)
def _tables() -> Dict[str, Any]:
    x = _ext()
    ops = {d["name"]: d for d in x.op_table()}
    macros = {d["name"]: d for d in x.macro_table()}
    every = dict(ops)
    every.update(macros)
    alu = {d["name"]: d for d in x.alu_table()}
    dtypes = {d["name"]: d for d in x.dtype_table()}
    slots = {s["name"]: s for d in every.values() for s in d["slots"]}
    imm, iimm = x.imm_defaults()
    t = {
        #: OP rows by mnemonic: {name, engines, default_engine, cost_class, slots}
        "OPS": ops,
        #: MACRO rows (frontend ops lowered to several instructions: nc_matmul)
        "MACROS": macros,
        #: engines allowed per op (OP and MACRO rows)
        "OP_ENGINES": {n: tuple(d["engines"]) for n, d in every.items()},
        "DEFAULT_ENGINE": {n: d["default_engine"] for n, d in every.items()},
        #: slot names per op, in slot order
        "OP_SLOTS": {n: tuple(s["name"] for s in d["slots"]) for n, d in every.items()},
        "ENGINES": tuple(x.engines()),
        "ALU": alu,
        "ALU_OPS": tuple(alu),
        "ACT_FUNCS": tuple(x.act_funcs()),
        "DTYPES": dtypes,
        "DTYPE_NAMES": tuple(dtypes),
        #: every slot key of kernel.json ops
        "SLOT_KEYS": tuple(slots),
        #: slots ops write (role out / vec_out) and slots ops read (role in / vec_in), in table order
        "WRITTEN_SLOTS": tuple(dict.fromkeys(s["name"] for d in every.values() for s in d["slots"] if s["written"])),
        #: slots of role out (the written tensor operands: dst, dst_idx; not the (P, 1) vec_out registers)
        "OUT_SLOTS": tuple(dict.fromkeys(s["name"] for d in every.values() for s in d["slots"] if s["role"] == "out")),
        "READ_SLOTS": tuple(dict.fromkeys(s["name"] for d in every.values() for s in d["slots"] if not s["written"])),
        "FLAGS": tuple(x.instr_flags()),
        "IMM_DEFAULT": tuple(imm),
        "IIMM_DEFAULT": tuple(iimm),
        #: ops whose iimm entries may be loop index expressions (isa::kIimmExprOps)
        "IIMM_EXPR_OPS": frozenset(x.iimm_expr_ops()),
        "PARAMS": tuple(x.param_schema()),
        #: ALU operators an instruction argument accepts (isa/alu_sets.def), in table order
        "ALU_SETS": {k: tuple(v) for k, v in x.alu_sets().items()},
    }
    return t


def alu_of_class(*classes: str) -> frozenset:
    """ALU operator names whose class (isa/alu_ops.def) is one of ``classes``."""
    return frozenset(n for n, d in _tables()["ALU"].items() if d["class"] in classes)


def alu_of_arity(arity: int) -> frozenset:
    """ALU operator names of arity 1 (unary: the second operand is ignored) or 2."""
    return frozenset(n for n, d in _tables()["ALU"].items() if d["arity"] == arity)


def _overrides(overrides) -> List[str]:
    from nsim._core import _overrides as norm  # one normalisation of overrides (dict, list or string)

    return norm(overrides)


@functools.lru_cache(maxsize=64)
def _config_values(config: str, overrides: tuple) -> Dict[str, Any]:
    from nsim._core import _call  # nsim exceptions (ConfigError ...) for the extension's errors

    return dict(_call(_ext().config_values, config, list(overrides)))


def config_values(config: str = "trn2", overrides: Any = None) -> Dict[str, Any]:
    """Every parameter (engines/params.def) of the resolved configuration ``config`` + ``overrides``, in its
    kind's unit (GHz, bytes, B/ns, ps, cycles): ``{"tensor.pe_rows": 128, ...}``. Raises ConfigError."""
    return dict(_config_values(str(config), tuple(_overrides(overrides))))


@functools.lru_cache(maxsize=64)
def _limits(config: str, overrides: tuple) -> Dict[str, Any]:
    from nsim._core import _call

    return dict(_call(_ext().limits, config, list(overrides)))


def limits(config: str = "trn2", overrides: Any = None) -> Dict[str, Any]:
    """The operand limits of a configured core (isa::Limits, derived from CoreParams)."""
    return dict(_limits(str(config), tuple(_overrides(overrides))))


@functools.lru_cache(maxsize=256)
def matmul_dtype_rule(stationary: str, moving: str, generation: int, fp8_double_row: bool, double_row: bool = False,
                      transpose: bool = False):
    """nc_matmul's input dtype rules (isa::matmul_dtype_rule, isa/isa.cpp): None when dtypes ``stationary`` and
    ``moving`` (IR names) may be multiplied on a core of that generation, with or without the fp8 double-row mode
    (tensor.fp8_double_row), else (error name, message) of the first rule broken."""
    return _ext().matmul_dtype_rule(stationary, moving, int(generation), bool(fp8_double_row), bool(double_row),
                                    bool(transpose))


def __getattr__(name: str):
    t = _tables()
    if name in t:
        # module globals from now on: a module __getattr__ call per use was 7 % of tracing a kernel
        globals().update(t)
        return t[name]
    raise AttributeError("module 'nsim._isa' has no attribute {!r}".format(name))
