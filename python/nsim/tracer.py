"""Eager tracer: turns a running NKI kernel (Python function) into nsim's kernel IR (kernel.json).

Every instruction goes through ONE seam, :func:`emit`. The tracer owns the statement list, the tensor
table, unique tensor names, source locations (the first stack frame outside the nsim package) and the
nc_matmul ``accumulate=None`` bookkeeping.

Loops: ``nl.affine_range`` / ``nl.sequential_range`` bodies are recorded once with a symbolic index (a
:class:`Sym`) and become kernel-IR loops when the body's Python control flow does not depend on the index
(Tracer.symbolic_loop has the rules); otherwise :func:`trace` traces the kernel again with that loop peeled
(first and last iteration with int indices, the rest a loop), recorded in pieces (a comparison of the index that
changes in the middle: _narrow; pieces that allocate tiles are written out iteration by iteration, as unrolled)
or unrolled (the Python body runs every iteration and emits constant indices: the semantics of sequential
execution). docs/kernel-json.md "Loops
from the Python tracer" explains when loops are kept. Loops are kept by default (:data:`LOOPS`); the kernel
option ``loops="unroll"`` (or NSIM_LOOPS=unroll) unrolls every loop; NSIM_EXPLAIN_LOOPS=1 says why a loop
was not kept.

This module is dialect-neutral: ``nsim.nki`` (new dialect) builds on it; a Beta-1 tree can too.
"""
from __future__ import annotations

import functools
import gc
import inspect
import itertools
import json
import linecache
import math
import os
import re
import sys
import threading
import types
import warnings
import weakref

import numpy as np

try:  # ml_dtypes is a hard dependency of the dtype model (bf16, fp8)
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover
    ml_dtypes = None

# --------------------------------------------------------------------------------------------------
# Errors: the classes of nsim._core when available, else stand-ins with the same attributes.
# --------------------------------------------------------------------------------------------------

from nsim import _errors
from nsim import _isa  # the ISA tables (opcodes, slots, dtypes) from _nsim, loaded on first use

try:
    from nsim import _core  # type: ignore
except Exception:  # pragma: no cover - the extension may not be built yet
    _core = None


class _FallbackNsimError(RuntimeError):
    """Stand-in for nsim._core.NsimError when the extension is not built (same attributes)."""

    def __init__(self, message, code=None, file="", line=0, function=""):
        code = code if code is not None else _errors.code("Internal")
        self.code, self.message, self.file, self.line, self.function = code, message, file, line, function
        where = " [at {}:{}]".format(file, line) if file and line else ""
        super().__init__("{}: {}{}".format(code, message, where))


def _core_cls(name, base):
    c = getattr(_core, name, None) if _core is not None else None
    if isinstance(c, type) and issubclass(c, BaseException):
        return c
    return type(name, (base,), {"__module__": __name__})


NsimError = _core_cls("NsimError", _FallbackNsimError) if _core is not None else _FallbackNsimError
ConfigError = _core_cls("ConfigError", NsimError)
AccessError = _core_cls("AccessError", NsimError)
OperandError = _core_cls("OperandError", NsimError)
KernelError = _core_cls("KernelError", NsimError)
NotSupportedError = _core_cls("NotSupportedError", KernelError) if _core is not None else \
    type("NotSupportedError", (KernelError, NotImplementedError), {"__module__": __name__})
InternalError = _core_cls("InternalError", NsimError)

def _real_dir(path):
    """``path`` resolved (symlinks, ``..``, case on case-insensitive systems) for prefix comparisons."""
    return os.path.normcase(os.path.realpath(path))


# Where the package really lives (.../python/nsim, or site-packages/nsim): "internal" is decided by this
# directory, never by a folder name (a checkout named "nsim" holds user code too), and works with spaces.
_PKG_DIR = _real_dir(os.path.dirname(os.path.abspath(__file__)))
# The kernel library is user-level code: its instructions are attributed to its own lines.
_USER_SUBDIRS = tuple(os.path.join(_PKG_DIR, d) + os.sep for d in ("kernels",))

_INTERNAL_FILE = {}  # co_filename -> True for nsim's own machinery (cached: hot in tracing)


def _classify(co_filename):
    """True when ``co_filename`` is a file of the nsim package outside ``nsim/kernels``."""
    if not co_filename or co_filename.startswith("<"):  # "<string>", "<frozen ...>", "<stdin>"
        return False
    path = _real_dir(co_filename)
    if not path.startswith(_PKG_DIR + os.sep):
        return False
    return not path.startswith(_USER_SUBDIRS)


def _is_internal(co_filename):
    v = _INTERNAL_FILE.get(co_filename)
    if v is None:
        v = _INTERNAL_FILE[co_filename] = _classify(co_filename)
    return v


def _user_traceback(tb):
    """The traceback without the frames inside the nsim package (None if nothing remains)."""
    keep = []
    while tb is not None:
        if not _is_internal(tb.tb_frame.f_code.co_filename):
            keep.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(keep):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def user_facing(fn):
    """Decorator for public entry points: an exception (a bug in the user's kernel, or an nsim
    error pointing at the user's line) propagates with nsim's internal frames removed."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise e.with_traceback(_user_traceback(e.__traceback__))

    return wrapper


_ENV_KEYS = {}  # variable name -> its os.environ key (encoded)


def env_get(name):
    """``os.environ.get(name)``, read from the live mapping behind os.environ (which os.environ's setitem and delitem,
    monkeypatch's too, keep up to date) by its encoded key: os.environ.get encodes the key on every call and, for an
    unset variable, raises and catches a KeyError, ~1 us; nl.tile_size and nisa.get_nc_version read their variables
    for every tile and matmul traced (4-5 % of tracing the library's flash attention)."""
    env = os.environ
    data = getattr(env, "_data", None)
    decode = getattr(env, "decodevalue", None)
    if data is None or decode is None:  # (not CPython's os._Environ)
        return env.get(name)
    k = _ENV_KEYS.get(name)
    if k is None:
        k = _ENV_KEYS[name] = env.encodekey(name)
    v = data.get(k)
    return None if v is None else decode(v)


_LINENOS = {}  # (id(code), f_lasti) -> (code, line): frame.f_lineno decodes the code's whole line table


def _lineno(f):
    """``f.f_lineno``, cached by (code, instruction offset): reading f_lineno costs time proportional to the
    function's length (~1 us in a 100-line kernel, several in longer ones), and tracing asks it a few times
    per statement. The code object is kept in the entry (so its id cannot be reused while cached)."""
    code = f.f_code
    key = (id(code), f.f_lasti)
    e = _LINENOS.get(key)
    if e is None or e[0] is not code:
        e = _LINENOS[key] = (code, f.f_lineno)
    return e[1]


def user_frame(skip=0, pos=None):
    """The innermost stack frame outside the nsim package (the user's kernel line). ``skip``: callers of the
    caller known to be nsim's own, not looked at. ``pos``: a list to which the id of the code and the instruction
    offset of each of nsim's frames passed on the way are appended, innermost first."""
    f = sys._getframe(1 + skip)
    known = _INTERNAL_FILE  # (_is_internal inlined: this runs for every statement traced)
    while f is not None:
        fn = f.f_code.co_filename
        v = known.get(fn)
        if v is None:
            v = _is_internal(fn)
        if not v:
            return f
        if pos is not None:
            pos.append(id(f.f_code))
            pos.append(f.f_lasti)
        f = f.f_back
    return None


_TILE_SITES = {}  # Tracer.tile's frame positions -> (its pool key's lines, the assigned name, the code objects)
_INNER_LINES = {}  # user_frame's pos of nsim's frames -> (their lines, their code objects): Tracer.tile's pool key


def _inner_lines(pos, f, frame):
    """The lines of nsim's frames from ``f`` (out) to the user's ``frame``, whose user_frame ``pos`` (a tuple) is
    ``pos``: cached by it, a lookup for a tile made as one before (no _lineno per frame). The entry keeps the code
    objects, so that the ids in its key stay theirs."""
    e = _INNER_LINES.get(pos)
    if e is None:
        codes, lines = [], []
        while f is not frame:
            codes.append(f.f_code)
            lines.append(_lineno(f))
            f = f.f_back
        e = _INNER_LINES[pos] = (tuple(lines), tuple(codes))
    return e[0]


def user_loc():
    return _frame_loc(user_frame())


def _frame_loc(f):
    """The source location of user frame ``f`` (user_loc())."""
    if f is None:
        return {"file": "", "line": 0, "function": ""}
    return {"file": f.f_code.co_filename, "line": _lineno(f), "function": f.f_code.co_name}


_STACKS = {}  # ((code, line), ...) of the callers -> their rendered stack (cached: hot in tracing)


def user_callers(f):
    """The frames that called user frame ``f``, innermost first, up to nsim's own machinery (which called the kernel)."""
    out = []
    g = f.f_back
    known = _INTERNAL_FILE  # (_is_internal inlined, as in user_frame)
    while g is not None:
        fn = g.f_code.co_filename
        v = known.get(fn)
        if v is None:
            v = _is_internal(fn)
        if v:
            break
        out.append(g)
        g = g.f_back
    return out


def user_stack(f):
    """The callers of user frame ``f`` up to nsim's own machinery (which called the kernel), outermost first:
    "kernel (file.py:12) > helper (file.py:30)"; "" when ``f`` is the kernel function itself."""
    callers = user_callers(f)
    if not callers:
        return ""
    key = tuple((g.f_code, _lineno(g)) for g in callers)
    s = _STACKS.get(key)
    if s is None:
        s = _STACKS[key] = " > ".join("{} ({}:{})".format(c.co_name, os.path.basename(c.co_filename), n)
                                      for c, n in reversed(key))
    return s


_default_user_loc = user_loc


_ASSIGN_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)")
_ASSIGNED = {}  # (file, line) -> the variable a statement assigns to, or None
_STMT_START = {}  # file -> {continuation line of a multi-line simple statement: the statement's first line}


def _statement_start(filename, line):
    """The first line of the simple statement of ``filename`` that spans ``line`` (``line`` itself when it starts
    one, or when the file cannot be parsed). A call on a continuation line (``offset = nisa.iota(...,`` /
    ``dtype=nl.int32).broadcast_to(shape)``: Python reports the line of ``.broadcast_to``) belongs to the statement
    that begins above it, not to a ``dtype=`` keyword there."""
    starts = _STMT_START.get(filename)
    if starts is None:
        starts = _STMT_START[filename] = {}
        try:
            import ast
            tree = ast.parse("".join(linecache.getlines(filename)))
        except (SyntaxError, ValueError):
            tree = None
        for node in (ast.walk(tree) if tree is not None else ()):
            if isinstance(node, ast.stmt) and not hasattr(node, "body") and (node.end_lineno or 0) > node.lineno:
                for ln in range(node.lineno + 1, node.end_lineno + 1):
                    starts[ln] = node.lineno
    return starts.get(line, line)


def assigned_name(f=None):
    """The variable the user's current statement (in frame ``f``, default the user's frame) assigns to
    (``x = nl.load(...)`` -> "x"), or None: the kernel's names for tiles and tensors (errors, disasm, traces
    and analysis use them)."""
    f = f if f is not None else user_frame()
    if f is None:
        return None
    key = (f.f_code.co_filename, _lineno(f))
    v = _ASSIGNED.get(key, False)
    if v is False:
        m = _ASSIGN_RE.match(linecache.getline(key[0], _statement_start(*key)) or "")
        v = _ASSIGNED[key] = m.group(1) if m and m.group(1) not in ("_", "__") else None
    return v


# Resource limits of tracing (ResourceLimit, E416). A loop that cannot be kept is unrolled while tracing, so a
# huge trip count would run and store statements until memory runs out: a single loop may not have more than
# MAX_LOOP_TRIPS iterations, a kernel not more than MAX_TRACED_STATEMENTS statements. Raise them by assignment
# (nsim.tracer.MAX_LOOP_TRIPS = ...) or with the environment variables of the same name prefixed NSIM_.
MAX_LOOP_TRIPS = int(os.environ.get("NSIM_MAX_LOOP_TRIPS", 1 << 20))
MAX_TRACED_STATEMENTS = int(os.environ.get("NSIM_MAX_TRACED_STATEMENTS", 1 << 22))


def check_loop_trips(r, what):
    """`r` (a range) if its trip count is within MAX_LOOP_TRIPS, else ResourceLimit naming the loop."""
    if len(r) > MAX_LOOP_TRIPS:
        raise make_error("ResourceLimit", "resource limit: {}({}, {}, {}) has {} iterations, more than "
                         "nsim.tracer.MAX_LOOP_TRIPS = {} (the loop is unrolled while tracing); raise it, or the "
                         "environment variable NSIM_MAX_LOOP_TRIPS".format(what, r.start, r.stop, r.step, len(r),
                                                                          MAX_LOOP_TRIPS))
    return r


class VirtualRegister:
    """A sequencer register (``nisa.register_alloc``, spec §2.3). A loop whose body uses a register is unrolled
    while tracing, so a register holds its value at trace time: ``register_load`` reads the tensor's current
    value through the eager numerics (the instructions traced so far run in the C++ core), and dynamic loop
    bounds, ``while_loop`` conditions and ``.ap(scalar_offset=reg)`` use that value. Python cannot branch on it
    directly (``bool``, ``int`` and ``range`` raise TypeError, as in NKI's tracer). ``loads``: the labels of the
    ``register_load`` instructions its value came from; what uses the register waits for them (kernel.json
    ``"after"``: a view addressed by it, a runtime loop bounded or exited by it)."""

    __slots__ = ("value", "frozen", "loads")

    def __init__(self, value=0, frozen=False, loads=()):
        self.value, self.frozen, self.loads = value, frozen, tuple(loads)

    def __bool__(self):
        raise TypeError("a VirtualRegister has no Python truth value; use nl.while_loop")

    def __index__(self):
        raise TypeError("a VirtualRegister is not a Python int; use it as a loop bound or a scalar_offset")

    __int__ = __index__

    def __repr__(self):
        return "VirtualRegister({})".format(self.value)


def register_loads(*vs):
    """The register_load labels the values ``vs`` (ints or VirtualRegisters) depend on, in order, once each."""
    out = []
    for v in vs:
        for lbl in getattr(v, "loads", ()) if isinstance(v, VirtualRegister) else ():
            if lbl not in out:
                out.append(lbl)
    return tuple(out)


def register_value(v, what):
    """The trace-time int of a loop bound / offset that may be a VirtualRegister."""
    if isinstance(v, VirtualRegister):
        v = v.value
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise make_error("BadArgument", "{}: expected an int or a VirtualRegister holding one, got {!r}".format(
            what, v))
    return int(v)


def int_immediate(value, what):
    """`value` as an int for an integer tile (a fill value, a memset immediate), or BadArgument naming `what`
    for NaN, an infinity or a non-integral number."""
    if isinstance(value, (bool, int, np.integer, np.bool_)):
        return int(value)
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise make_error("BadArgument", "{}: expected a number, got {!r}".format(what, value)) from None
    if not np.isfinite(f) or f != int(f):
        raise make_error("BadArgument", "{}: {!r} cannot be stored in an integer tile (use a finite "
                         "integral value)".format(what, value))
    return int(value)


def make_error(name, message, loc=None):
    """The nsim error ``name`` (a row of sim/errors.def, e.g. "BadReshape") with .code/.message/.file/.line
    pointing at the user's line; its class comes from the row's family."""
    loc = loc if loc is not None else user_loc()
    code = _errors.code(name)
    cls = _core.error_class(code) if _core is not None else NsimError
    return cls(message, code=code, file=loc.get("file", ""), line=loc.get("line", 0),
               function=loc.get("function", ""))


# --------------------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------------------

def mx_x4_dtype(name):
    """The numpy dtype of an MX x4-packed type of isa/dtypes.def (``values`` 4): a single-field structured dtype
    named after the type over its packed bits (uint32 / uint16), so the three compare unequal to each other and
    to uint32 (nki-api.md 3.2); None for any other name."""
    d = _isa.DTYPES.get(name)
    if d is None or d.get("values", 1) != 4:
        return None
    return np.dtype([(name, "<u{}".format(d["bytes"]))])


_DTYPE_NAMES = {}  # dtype argument -> its IR name (hot in tracing: every tile names its dtype)
_TF32 = np.dtype("V4")  # nl.tfloat32


def _memoized(cache, fn, key):
    """``fn(key)``, remembered in ``cache`` (a key that cannot be hashed is worked out every time)."""
    try:
        return cache[key]
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    value = fn(key)
    try:
        cache[key] = value
    except TypeError:
        pass
    return value


def dtype_name(dtype):
    """IR dtype name of a numpy / ml_dtypes dtype (or of a name)."""
    return _memoized(_DTYPE_NAMES, _dtype_name, dtype)


def _dtype_name(dtype):
    ir = _isa.DTYPES  # isa/dtypes.def
    if isinstance(dtype, str) and dtype in ir:
        return dtype
    try:
        nd = np.dtype(dtype)
    except TypeError:
        raise make_error("BadDtype", "unsupported dtype {!r}".format(dtype))
    if nd.names is not None and len(nd.names) == 1 and mx_x4_dtype(nd.names[0]) == nd:
        return nd.names[0]  # an MX x4 type (float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4)
    if nd == _TF32:
        return "tfloat32"  # nl.tfloat32: 4 opaque bytes in numpy (nki-api.md 3.2), the IR's tfloat32
    name = nd.name
    if name not in ir:
        # (the dtypes from isa/dtypes.def; a 64-bit one is usually numpy's default: np.random.rand, np.arange)
        wide = {"float64": "float32", "int64": "int32", "uint64": "uint32"}.get(name)
        raise make_error("BadDtype", "dtype {} is not supported by nsim: the NeuronCore's dtypes are {}{}".format(
            name, ", ".join(ir), "" if wide is None else "; convert the array with .astype(np.{}) (numpy makes {} "
            "by default)".format(wide, name)))
    return name


_NP_DTYPES = {}  # np_dtype's results: tensor.dtype asks it several times per traced op (np.dtype(str) parses)


def np_dtype(name):
    """The numpy dtype of IR dtype name ``name``."""
    return _memoized(_NP_DTYPES, _np_dtype, name)


def _np_dtype(name):
    if name == "tfloat32":
        return np.dtype(np.float32)
    if name == "bool":
        return np.dtype(np.bool_)
    x4 = mx_x4_dtype(name)
    if x4 is not None:
        return x4
    return np.dtype(name)  # ml_dtypes registers bfloat16 / float8_* with numpy


# --------------------------------------------------------------------------------------------------
# Shapes and tensors
# --------------------------------------------------------------------------------------------------


class Shape(tuple):
    """A tuple that also compares equal to a list (Beta-1 code writes ``x.shape == [2, 2]``)."""

    def __eq__(self, other):
        if isinstance(other, list):
            other = tuple(other)
        return tuple.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = tuple.__hash__


# --------------------------------------------------------------------------------------------------
# Symbolic loop indices (loops kept as loops in the kernel IR)
# --------------------------------------------------------------------------------------------------
#
# A loop of nl.affine_range / nl.sequential_range whose body's Python control flow does not depend on the
# index is recorded ONCE with a symbolic index (a Sym: c + sum coef * var), and becomes a "loop" statement of
# kernel.json with affine index expressions. Anything that needs the index as a concrete int (__index__,
# __int__, __bool__, comparisons, hashing, a non-exact // or %, a shape, a value read in the body, ...)
# raises _NeedsConcrete; trace() then traces the kernel again with that loop (its source line) unrolled.
# See Tracer.symbolic_loop for the whole set of rules.

#: How the tracer treats nl.affine_range / nl.sequential_range loops by default: "unroll" (every iteration
#: runs and emits int indices) or "keep" (kept as kernel-IR loops where the body allows it). The kernel
#: option ``loops=`` (``kernel.options(loops="keep")``, ``nsim.options(loops="keep")``) wins over it; the
#: environment variable NSIM_LOOPS sets it. Default "keep" (since 2026-12-02): the numerics are the
#: unrolled trace's, the simulated time the same in most kernels (where it differs, the kept loop's
#: rotating buffers and the unrolled trace's storages differ); docs/kernel-json.md "Loops from the Python
#: tracer".
LOOPS = os.environ.get("NSIM_LOOPS", "keep")
LOOP_MODES = ("unroll", "keep")


def loops_mode(value, what="loops"):
    """The loop mode ``value`` (None: the default, :data:`LOOPS`), checked."""
    v = LOOPS if value is None else value
    if v not in LOOP_MODES:
        raise make_error("BadArgument", "{}={!r}: expected one of {}".format(what, v, ", ".join(
            repr(m) for m in LOOP_MODES)))
    return v


_PLAIN = (int, float, bool, str, bytes, type(None))


def _plain_locals(frame):
    """The local variables of ``frame`` holding plain Python values -- numbers, strings, None, and lists, tuples,
    sets and dicts of them (one level) -- by name: what a loop body run twice with a symbolic index must leave the
    same for its recording to stand for every iteration (Tracer._record_piece)."""
    def one(x):  # (a float by its repr: a NaN equals itself)
        return repr(x) if type(x) is float else x

    out = {}
    loc = frame.f_locals
    for k, v in loc.items():
        t = type(v)
        if t in _PLAIN:
            out[k] = one(v)
        elif t in (list, tuple, set, frozenset) and all(type(x) in _PLAIN for x in v):
            out[k] = (t, tuple(one(x) for x in v) if t in (list, tuple) else frozenset(one(x) for x in v))
        elif t is dict and all(type(x) in _PLAIN for x in v.values()) and all(type(x) in _PLAIN for x in v):
            out[k] = (t, tuple((one(a), one(b)) for a, b in v.items()))
    if type(loc) is dict:
        # Before Python 3.13 f_locals is a snapshot dict the frame keeps: its references would keep this pass's
        # tiles alive, so the next pass's tiles could not take their storage back (the unrolled trace's rotation).
        # The frame fills it again whenever it is next asked for; a 3.13 proxy reads the locals and holds nothing.
        loc.clear()
    return out


class _NeedsConcrete(BaseException):
    """Internal: the loop being recorded symbolically must be unrolled (``key``: its source (file, line), or
    None for the innermost loop being recorded). A BaseException, so that ``except Exception`` in user code
    or in nsim does not swallow it."""

    def __init__(self, why, key=None, peel=False, pair=False, expand=False, sanitizer=False):
        super().__init__(why)
        self.why, self.key = why, key
        self.peel = peel  # running the first and last iterations concretely may help (Tracer.symbolic_loop)
        self.pair = pair  # the peeled loop's middle is to be recorded two iterations per pass (_record_loop)
        self.expand = expand  # the loop is to be recorded and written out iteration by iteration (_record_piece)
        self.sanitizer = sanitizer  # asked by the sanitizer's affine_range check alone (see _trace)


class LoopVar:
    """The index of a loop being recorded symbolically: ``name`` in the IR, values ``range(start, stop,
    step)``; ``final`` is its last value once the loop is done (a Sym over closed loops is an int)."""

    __slots__ = ("name", "lo", "hi", "final", "key", "depth", "step", "split")

    def __init__(self, name, r, key, depth, split=False):
        self.name, self.key, self.depth = name, key, depth
        self.lo, self.hi = min(r[0], r[-1]), max(r[0], r[-1])
        self.final = None
        self.step = abs(r.step)
        # its range may be narrowed while a pass of its body runs (a comparison whose outcome would differ
        # between iterations: _narrow); the loop is then recorded in pieces (Tracer._record_loop)
        self.split = split and r.step > 0


class Sym:
    """An affine value ``c + sum(coef * var)`` over the indices of the loops being recorded. Arithmetic with
    ints (+, -, * and exact // and %) stays affine; anything needing an int raises _NeedsConcrete (the loop
    is then unrolled). Once its loops are done it behaves as the int of their last iteration."""

    __slots__ = ("c", "terms")
    __array_ufunc__ = None  # numpy scalars defer to our reflected operators

    def __init__(self, c, terms):
        self.c, self.terms = c, terms  # terms: tuple of (LoopVar, coef != 0)

    # -- helpers
    def _open(self):
        c, t = self.c, []
        for v, k in self.terms:
            if v.final is not None:
                c += k * v.final
            else:
                t.append((v, k))
        return c, t

    @staticmethod
    def make(c, terms):
        c, t = int(c), []
        for v, k in terms:
            if v.final is not None:
                c += k * v.final
            elif k:
                t.append((v, k))
        return Sym(c, tuple(t)) if t else c

    def resolved(self):
        """The int when no open loop is involved, else self."""
        c, t = self._open()
        return Sym(c, tuple(t)) if t else c

    def _need(self, what):
        c, t = self._open()
        if not t:
            return c
        inner = max(t, key=lambda vk: vk[0].depth)[0]
        raise _NeedsConcrete("{} of the loop index '{}'".format(what, inner.name), inner.key)

    def lo(self):
        c, t = self._open()
        return c + sum(k * (v.lo if k > 0 else v.hi) for v, k in t)

    def hi(self):
        c, t = self._open()
        return c + sum(k * (v.hi if k > 0 else v.lo) for v, k in t)

    def vars(self):
        return [v for v, _ in self._open()[1]]

    def expr(self):
        """The IR text of the expression (docs/kernel-json.md "Index expressions"), or its int."""
        c, t = self._open()
        if not t:
            return c
        parts = []
        for v, k in t:
            term = v.name if abs(k) == 1 else "{}*{}".format(abs(k), v.name)
            parts.append(("- " if k < 0 else "+ ") + term if parts else ("-" if k < 0 else "") + term)
        if c:
            parts.append("{} {}".format("-" if c < 0 else "+", abs(c)))
        return " ".join(parts)

    def __repr__(self):
        return "Sym({})".format(self.expr())

    def __str__(self):  # print(i): the unrolled trace prints every value
        return str(self._need("a string"))

    # -- arithmetic
    @staticmethod
    def _int(o):
        if type(o) is int:  # (the common case first: loop index arithmetic with int constants)
            return o
        if isinstance(o, (bool, np.bool_)):
            return int(o)
        if isinstance(o, (int, np.integer)):
            return int(o)
        return None

    def __add__(self, o):
        if isinstance(o, Sym):
            d = {}
            for v, k in self.terms + o.terms:
                d[v] = d.get(v, 0) + k
            return Sym.make(self.c + o.c, list(d.items()))
        i = self._int(o)
        if i is None:
            return NotImplemented if not isinstance(o, float) else self._need("float arithmetic") + o
        return Sym.make(self.c + i, self.terms)

    __radd__ = __add__

    def __neg__(self):
        return Sym.make(-self.c, [(v, -k) for v, k in self.terms])

    def __pos__(self):
        return self

    def __sub__(self, o):
        if isinstance(o, Sym):
            return self + (-o)
        i = self._int(o)
        if i is None:
            return NotImplemented if not isinstance(o, float) else self._need("float arithmetic") - o
        return Sym.make(self.c - i, self.terms)

    def __rsub__(self, o):
        return (-self) + o

    def __mul__(self, o):
        if isinstance(o, Sym):
            r = o.resolved()
            if isinstance(r, Sym):
                s = self.resolved()
                if isinstance(s, Sym):
                    return self._need("a product of loop indices")
                return r * s
            o = r
        i = self._int(o)
        if i is None:
            return NotImplemented if not isinstance(o, float) else self._need("float arithmetic") * o
        return Sym.make(self.c * i, [(v, k * i) for v, k in self.terms])

    __rmul__ = __mul__

    def __floordiv__(self, o):
        i = self._int(o.resolved() if isinstance(o, Sym) else o)
        if i is None or i == 0:
            return self._need("a division") // o
        c, t = self._open()
        if c % i == 0 and all(k % i == 0 for _, k in t):
            return Sym.make(c // i, [(v, k // i) for v, k in t])
        if i > 0 and self.lo() // i == self.hi() // i:  # the same quotient in every iteration
            return self.lo() // i
        return self._need("a non-exact floor division") // i

    def __mod__(self, o):
        i = self._int(o.resolved() if isinstance(o, Sym) else o)
        if i is None or i == 0:
            return self._need("a modulo") % o
        c, t = self._open()
        if all(k % i == 0 for _, k in t):
            return c % i
        if i > 0 and self.lo() // i == self.hi() // i:  # no wrap in any iteration: x % i = x - q * i
            return self - (self.lo() // i) * i
        return self._need("a modulo") % i

    def __rfloordiv__(self, o):
        return o // self._need("a division by")

    def __rmod__(self, o):
        return o % self._need("a modulo by")

    def __truediv__(self, o):
        return self._need("a true division") / o

    def __rtruediv__(self, o):
        return o / self._need("a true division by")

    def __pow__(self, o):
        return self._need("a power") ** o

    # -- everything that needs an int
    def __index__(self):
        return self._need("an int (__index__)")

    def __int__(self):
        return self._need("int()")

    def __float__(self):
        return float(self._need("float()"))

    def __bool__(self):
        return not self.__eq__(0)

    def __hash__(self):
        return hash(self._need("a hash"))

    def _range_of_diff(self, o):
        """(lo, hi) of self - o over every iteration of the open loops (lo == hi: a constant)."""
        if isinstance(o, (float, np.floating)):
            v = self._need("a comparison with a float")
            return v - o, v - o
        d = self - o
        if d is NotImplemented:
            raise TypeError("cannot compare a loop index with {!r}".format(o))
        if isinstance(d, Sym):
            return d.lo(), d.hi()
        return d, d

    def _decide(self, o, test, what):
        """The comparison when its outcome is the same in every iteration, else the loop cannot stay symbolic
        (a comparison that differs between iterations: the loop is peeled or unrolled)."""
        lo, hi = self._range_of_diff(o)
        if _constant(test, what, lo, hi):
            return test(lo)
        d = self - o
        r = _narrow(d, test, what)
        if r is not None:
            return r
        # the loop to peel: the outermost whose range could not be narrowed, else the innermost
        vs = [v for v, _ in d._open()[1]]
        fixed = [v for v in vs if not v.split]
        inner = min(fixed, key=lambda v: v.depth) if fixed else max(vs, key=lambda v: v.depth)
        raise _NeedsConcrete("a comparison ({}) of the loop index '{}' that differs between iterations".format(
            what, inner.name), inner.key, peel=True)

    def __eq__(self, o):
        if not isinstance(o, (Sym, int, float, np.integer, np.floating)):
            return NotImplemented
        return self._decide(o, lambda d: d == 0, "==")

    def __ne__(self, o):
        r = self.__eq__(o)
        return r if r is NotImplemented else not r

    def __lt__(self, o):
        return self._decide(o, lambda d: d < 0, "<")

    def __le__(self, o):
        return self._decide(o, lambda d: d <= 0, "<=")

    def __gt__(self, o):
        return self._decide(o, lambda d: d > 0, ">")

    def __ge__(self, o):
        return self._decide(o, lambda d: d >= 0, ">=")

    def __format__(self, spec):
        return format(self._need("formatting"), spec)


def _constant(test, what, lo, hi):
    """The outcome of ``test`` on a value known only to lie in [lo, hi] is the same for all of them."""
    return lo == hi or (test(lo) == test(hi) and (what in ("<", "<=", ">", ">=") or not (lo <= 0 <= hi)))


#: Most pieces a loop is recorded in (Tracer._record_loop) before the rest of it is unrolled instead, and most pieces
#: of one iteration in a row (each costs a pass over the rest of the range first: the loop's comparisons change at
#: every index).
MAX_PIECES = 16
MAX_SINGLE_PIECES = 2


def _narrow(d, test, what):
    """A comparison of the affine ``d`` (a Sym) with 0 whose outcome differs between iterations of the loops
    being recorded: the ranges of those loops are narrowed (each to a prefix of its remaining iterations) until
    the outcome is the same over all of them, the outcome of the first iteration; None when that takes narrowing a
    loop that cannot be recorded in pieces. Outermost loop first, each to its longest prefix on which the outcome holds whatever the
    inner loops' indices; where no prefix does, to its longest prefix on which it holds at the inner loops'
    first indices, and then the inner ones are narrowed the same way. Outcomes decided earlier in the pass stay
    true on the narrower ranges (docs/kernel-json.md "Loops recorded in pieces")."""
    c, terms = d._open()
    vs = sorted((v for v, _ in terms if v.split), key=lambda v: v.depth)
    if not vs:
        return None
    want = test(c + sum(k * v.lo for v, k in terms))
    old = [(v, v.hi) for v in vs]

    def holds():
        return _constant(test, what, d.lo(), d.hi())

    def longest(v):  # the largest hi of v (a prefix of its values) on which holds(), or None
        full = v.hi
        n = (full - v.lo) // v.step
        good, lo_m, hi_m = None, 0, n
        while lo_m <= hi_m:
            m = (lo_m + hi_m) // 2
            v.hi = v.lo + m * v.step
            if holds():
                good, lo_m = v.hi, m + 1
            else:
                hi_m = m - 1
        v.hi = full
        return good

    for j, v in enumerate(vs):
        t = longest(v)
        if t is not None:
            v.hi = t
            return want
        inner = [(u, u.hi) for u in vs[j + 1:]]
        for u, _ in inner:
            u.hi = u.lo
        t = longest(v)  # (the first point alone always holds: at worst v's first index)
        for u, h in inner:
            u.hi = h
        v.hi = v.lo if t is None else t
    if not holds():  # a loop that cannot be narrowed (recorded two iterations per pass) makes it differ
        for v, h in old:
            v.hi = h
        return None
    return want


def var_sym(var, k=1):
    """``k * var`` as a Sym."""
    return Sym(0, ((var, k),))


def _idx(x):
    """An index value: an int, or a Sym over open loops (a Sym over closed loops becomes its int)."""
    if isinstance(x, Sym):
        return x.resolved()
    return int(x)


class DynSlice:
    """``nl.ds(start, size)``: the slice start .. start+size. ``start`` is an int (or a loop index), a
    VirtualRegister (its trace-time value: a static slice), or a one-element on-chip int tensor: a *runtime*
    start (the view gets a runtime offset, spec §3.9 ``scalar_offset``; see :meth:`NkiTensor._dynamic`)."""

    __slots__ = ("start", "size", "step", "loads")

    def __init__(self, start, size, step=1):
        self.loads = register_loads(start)  # a register start: the view waits for its register_load
        if isinstance(start, VirtualRegister):
            start = register_value(start, "nl.ds(start=)")
        self.start = start if isinstance(start, NkiTensor) else _idx(start)
        self.size, self.step = int(size), int(step)

    def __repr__(self):
        return "ds({}, {})".format(self.start, self.size)


ON_CHIP = ("sbuf", "psum")


class _Regions(type):
    def __iter__(cls):  # the enum's members, in the spec's order (nki-api.md 3.1)
        return iter((cls.sbuf, cls.psum, cls.private_hbm, cls.shared_hbm))


class MemoryRegion(str, metaclass=_Regions):
    """A buffer: compares equal to its name ('sbuf', 'psum', 'private_hbm', 'shared_hbm'); the members are also
    attributes of the class, as the spec's enum has them (``nl.MemoryRegion.sbuf``)."""

    @property
    def ir(self):
        return "hbm" if self.endswith("hbm") else str(self)


class HbmRegion(MemoryRegion):
    """The ``.buffer`` of an HBM tensor: the string ``"hbm"`` (what nsim compares, hashes and writes), equal also to
    the spec's name of its kind -- ``nl.shared_hbm`` for a kernel's shared output (and every argument of an LNC=2
    launch), ``nl.hbm`` = ``nl.private_hbm`` for an argument or a private tensor (nki-api.md 1.6, 3.1) -- and to
    no other region."""

    def __new__(cls, kind):
        obj = str.__new__(cls, "hbm")
        obj.kind = kind  # "private_hbm" or "shared_hbm"
        return obj

    def __eq__(self, other):
        if isinstance(other, str):
            o = str(other)
            return o == "hbm" or o == self.kind
        return NotImplemented

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    __hash__ = str.__hash__

    def __repr__(self):
        return repr(self.kind)


class _Storage:
    """One IR tensor (an HBM tensor or an alloc'ed tile)."""

    __slots__ = ("name", "buffer", "dtype", "shape", "stale", "__weakref__")

    def __init__(self, name, buffer, dtype, shape):
        self.name, self.buffer, self.dtype, self.shape = name, buffer, dtype, tuple(shape)
        self.stale = None  # a tile of the first recorded iteration of a symbolic loop: that loop's key


class _ViewStorage(_Storage):
    """A re-dimensioned window of a real storage (a reshape, a multi-axis arange index, ...): virtual dim k
    of ``shape`` steps ``strides[k]`` elements of the real storage ``base`` (row-major flat element
    offsets), starting at ``offset``. Views of it index the virtual dims like a storage; their kernel-IR
    access is computed by :func:`ir_index` (one entry per dim of the real tensor)."""

    __slots__ = ("base", "offset", "strides")

    def __init__(self, base, offset, strides, shape):
        _Storage.__init__(self, base.name, base.buffer, base.dtype, shape)
        # (the offset may be affine in the indices of loops being recorded: a view moved by a loop index)
        self.base, self.offset = base, offset if isinstance(offset, Sym) else int(offset)
        self.strides = tuple(int(s) for s in strides)


class _RetypedStorage(_Storage):
    """The bytes of a real storage ``real`` seen as elements of another size (``t.view(dtype)``, ``.ap(dtype=)``,
    spec §3.9): dtype ``dtype`` (an IR name), the real shape with its last dim scaled by the ratio of the element
    sizes. Views of it index it like a storage; their kernel-IR access names the real tensor with this ``dtype``
    (kernel.json then reads the index against the scaled shape, docs/kernel-json.md)."""

    __slots__ = ("real",)

    def __init__(self, real, dtype, shape):  # (no _Storage.__init__: `stale` is the real storage's)
        self.name, self.buffer, self.dtype, self.shape = real.name, real.buffer, dtype, tuple(shape)
        self.real = real

    @property
    def stale(self):
        return self.real.stale

    @stale.setter
    def stale(self, v):
        self.real.stale = v


def _retype(b, off, name, what):
    """Storage ``b`` (real or retyped) with a view offset ``off`` in its elements, seen as dtype ``name`` of another
    element size: (the storage to index, the offset in its elements). The real storage itself when ``name`` is its
    own dtype."""
    real = b.real if isinstance(b, _RetypedStorage) else b
    ub, vb, rb = np_dtype(b.dtype).itemsize, np_dtype(name).itemsize, np_dtype(real.dtype).itemsize
    row = int(real.shape[-1]) * rb
    if row % vb or (real.buffer in ON_CHIP and len(real.shape) < 2):
        raise make_error("BadDtype", "{}: the last dim of '{}' {} {} holds {} bytes, not a whole number of {}-byte {} "
                         "elements (the view scales the last dim by the ratio of the element sizes)".format(
                             what, real.name, real.dtype, tuple(real.shape), row, vb, name))
    boff = off * ub
    if not isinstance(boff, Sym) and boff % vb:
        raise make_error("BadView", "{}: the view of '{}' starts at byte {}, not at a whole {}-byte {} element".format(
            what, real.name, boff, vb, name))
    noff = boff // vb  # (a loop-moved offset: exact division, else the loop is unrolled)
    if name == real.dtype:
        return real, noff
    return _RetypedStorage(real, name, tuple(real.shape[:-1]) + (row // vb,)), noff


def _rowmajor(shape):
    st, acc = [1] * len(shape), 1
    for i in reversed(range(len(shape))):
        st[i] = acc
        acc *= int(shape[i])
    return st


class _NotExpressible(Exception):
    pass


def _merge(pat):
    """Pattern [(stride, count), ...] (outer -> inner) with count-1 dims dropped and contiguous dims merged;
    each item is [stride, count, [pattern dim, ...]]."""
    items = []
    for vd, (s, c) in enumerate(pat):
        if c == 1:
            continue
        if items and items[-1][0] == s * c:
            items[-1][0] = s
            items[-1][1] *= c
            items[-1][2].append(vd)
            continue
        items.append([s, c, [vd]])
    return items


def ir_index(shape, offset, pat, chip):
    """The kernel-IR index (one entry per dim of a real tensor of ``shape``) of the elements
    ``offset + sum_k stride_k * i_k`` (``pat`` = [(stride, count), ...], outer -> inner), and the order in which
    the access visits the real dims (None: row-major, else a permutation: kernel.json ``order``). Raises
    _NotExpressible when the IR (one start/size/step or broadcast per real dim, each dim visited once) cannot
    express it."""
    n = len(shape)
    R = _rowmajor(shape)
    total = int(np.prod(shape, dtype=np.int64))
    if not 0 <= offset < total:
        raise _NotExpressible("offset {} outside the tensor".format(offset))
    start = [(offset // R[k]) % shape[k] for k in range(n)]

    def place(s, c):
        if s < 0:
            raise _NotExpressible("negative stride")
        k = None
        for kk in reversed(range(n)):
            if s % R[kk] == 0 and (s // R[kk] < shape[kk] or kk == 0):
                k = kk
                break
        if k is None:
            raise _NotExpressible("stride {} does not step along one dim".format(s))
        m = s // R[k]
        if start[k] + (c - 1) * m < shape[k]:
            return [(k, c, m)]
        if k == 0 or start[k] >= m or shape[k] % m:
            raise _NotExpressible("a run of {} elements with step {} leaves dim {} of size {}".format(c, m, k,
                                                                                                  shape[k]))
        c_in = shape[k] // m
        if c % c_in:
            raise _NotExpressible("a run of {} elements does not fill whole rows of dim {}".format(c, k))
        return place(R[k] * shape[k], c // c_in) + [(k, c_in, m)]

    items = _merge(pat)
    placed = []  # per item: list of (real dim, count, step) or None (broadcast)
    for s, c, _vds in items:
        placed.append(None if s == 0 else place(s, c))
    used = [k for p in placed if p for k, _, _ in p]
    if len(set(used)) != len(used):
        raise _NotExpressible("the view visits a dim of the tensor twice (an overlapping view)")
    idx = list(start)
    for k, c, m in (e for p in placed if p for e in p):
        idx[k] = {"start": start[k], "size": c} if m == 1 else {"start": start[k], "size": c, "step": m}
    taken = set(used)
    for i, p in enumerate(placed):
        if p is not None:
            continue
        lo = max([k for q in placed[:i] if q for k, _, _ in q], default=-1)
        hi = min([k for q in placed[i + 1:] if q for k, _, _ in q], default=n)
        host = [k for k in range(lo + 1, hi) if k not in taken and not (chip and k == 0)]
        if not host:  # out of order: any size-1 dim not visited yet (the order lists it at this place)
            host = [k for k in range(n) if k not in taken and not (chip and k == 0)]
        if not host:
            raise _NotExpressible("a broadcast (stride-0) dim has no free dim of the tensor to sit on")
        k = host[-1]
        taken.add(k)
        placed[i] = [(k, items[i][1], 0)]
        idx[k] = {"start": start[k], "broadcast": items[i][1]}
    if chip:
        p_count = pat[0][1] if pat else 1
        if p_count > 1:
            first = placed[0] if placed else None
            if first is None or first[0] != (0, p_count, 1):
                raise _NotExpressible("the partition dim of an on-chip view must stay dim 0 of the tile")
        elif 0 in used:
            raise _NotExpressible("a free dim of the view would step along the partitions")
    seq = [k for p in placed if p for k, _, _ in p]  # the real dims in visiting order
    if seq == sorted(seq):
        return idx, None
    order = seq + [k for k in range(n) if k not in seq]  # the dims not visited have size 1: last
    if chip:
        order.remove(0)
        order.insert(0, 0)
    return idx, order


def ir_redim(shape, offset, pat, chip):
    """For a view ``ir_index`` cannot place on ``shape`` (two strides over one dim: the NKI tutorial's transpose
    ``out_tile[i_p, i_x * ny + i_y] = ...``): the same elements re-dimensioned row-major (on chip the partition
    dim kept) so that each stride of ``pat`` steps along a dim of its own, as (shape, index, order) for a
    kernel-IR access with ``"shape"`` (docs/kernel-json.md); or, for broadcast (stride-0) dims with no dim of
    the tensor left to sit on, the tensor's shape with size-1 dims added for them (before its dims; on chip after
    the partition dim). None when no such shape exists (overlapping dims, broadcasts beside a second stride
    over one dim, a stride that does not divide the one outside it, a symbolic offset)."""
    if not isinstance(offset, (int, np.integer)):
        return None
    shape = [int(x) for x in shape]
    nb = sum(1 for s, _c, _v in _merge(pat) if s == 0)
    new = _redim_broadcast(shape, nb, chip) if nb else _redim_strides(shape, pat, chip)
    if new is None or new == shape:
        return None
    try:
        idx, order = ir_index(new, offset, pat, chip)
    except _NotExpressible:
        return None
    return new, idx, order


def ir_strided(shape, offset, pat, chip):
    """For a view neither ``ir_index`` nor ``ir_redim`` can express because its dims overlap (the 3x3 / stride-2
    windows ``t[i_p, 2 * i_h + i_kh, 2 * i_w + i_kw]`` of a max pool): a kernel-IR access with ``"shape"`` and
    ``"strides"`` (docs/kernel-json.md), the view's own dims with their element strides, which the hardware's
    access patterns take as they are (a destination only where no two elements meet: verify_kernel); a negative
    stride (a Toeplitz window) as its magnitude with an index step of -1. None when the view has a broadcast
    (stride-0), more free dims than an instruction takes, a symbolic offset, or (on chip) does not keep the
    partition dim first."""
    if not isinstance(offset, (int, np.integer)) or not pat or any(s == 0 and c != 1 for s, c in pat):
        return None
    unit = [s == 0 for s, _c in pat]  # size-1 dims without a stride: any stride does, with start 0 (below)
    pat = [(s or 1, c) for s, c in pat]
    # a negative stride (a Toeplitz window ``rel[(S - 1) - i_p + i_f]``) is its magnitude walked backwards: the
    # dim's index runs from count - 1 down (index step -1), the view's first element is then that many strides on
    neg = [s < 0 for s, _c in pat]
    if any(neg):  # (HBM only: on chip a negative partition step is E407)
        offset = int(offset) + sum(s * (c - 1) for s, c in pat if s < 0)
        if offset < 0:
            return None
        pat = [(-s, c) if s < 0 else (s, c) for s, c in pat]
    shape = [int(x) for x in shape]
    if chip:
        fsize = int(np.prod(shape[1:], dtype=np.int64))
        if pat[0][0] != fsize and pat[0][1] != 1:
            return None
        if len(pat) > 5 or offset // fsize + pat[0][1] > shape[0]:
            return None
        strides, sizes = [fsize] + [s for s, _c in pat[1:]], [c for _s, c in pat]
        starts, rem = [offset // fsize], offset % fsize
    else:
        strides, sizes = [s for s, _c in pat], [c for _s, c in pat]
        starts, rem = [], offset
    # the offset as starts on the dims, greatest stride first (the bounds are checked on the elements reached)
    first = 1 if chip else 0
    starts += [0] * (len(pat) - first)
    for k in sorted(range(first, len(pat)), key=lambda k: -strides[k]):
        starts[k], rem = divmod(rem, strides[k]) if strides[k] and not unit[k] else (0, rem)
    if rem:  # an offset finer than every stride (column h of ``rel[r - i_p + i_f, h]``): a size-1 unit-stride dim
        if len(pat) > (4 if chip else 5):
            return None
        strides, sizes, starts, neg = strides + [1], sizes + [1], starts + [rem], neg + [False]
    idx = [{"start": int(a) + int(c) - 1, "size": int(c), "step": -1} if n else {"start": int(a), "size": int(c)}
           for a, c, n in zip(starts, sizes, neg)]
    dims = [int(c) for c in sizes]
    if chip:
        dims[0] = shape[0]  # the tile's partitions, of which the index takes a range
    return {"shape": dims, "strides": [int(x) for x in strides], "index": idx}


def _redim_broadcast(shape, nb, chip):
    """``shape`` with ``nb`` size-1 dims for broadcast dims to sit on (a 1-D bias read as (128, n)): before its dims,
    on chip after the partition dim (at most 4 free dims); None past that."""
    new = [shape[0]] + [1] * nb + shape[1:] if chip else [1] * nb + shape
    return None if chip and len(new) > 5 else new


def _redim_strides(shape, pat, chip):
    """``shape`` re-dimensioned row-major so that each stride of ``pat`` steps along a dim of its own; None when
    the strides do not nest."""
    free = list(pat)
    if chip:  # the partition dim stays dim 0: the rest of the pattern steps within a partition
        fsize = int(np.prod(shape[1:], dtype=np.int64))
        if not free or (free[0][0] != fsize and free[0][1] != 1):
            return None
        lead, free = [shape[0]], free[1:]
    else:
        fsize, lead = int(np.prod(shape, dtype=np.int64)), []
    items = _merge(free)
    strides = sorted({s for s, _c, _v in items}, reverse=True)
    if len(strides) != len(items) or any(s <= 0 for s in strides):
        return None
    dims, outer = [], fsize
    for s in strides:
        if s >= outer or outer % s:
            return None
        dims.append(outer // s)
        outer = s
    if outer > 1:
        dims.append(outer)
    return lead + dims


_INT32_MAX = 2 ** 31 - 1


def _check_offset_tensor(t, what):
    """A runtime offset: a one-element SBUF int32/uint32 tensor (view)."""
    if not isinstance(t, NkiTensor) or t.buffer != "sbuf":
        raise make_error("BadOperandKind", "{}: needs a one-element SBUF int32/uint32 tensor, got {!r}".format(what, t))
    if np.dtype(t.dtype) not in (np.dtype(np.int32), np.dtype(np.uint32)):
        raise make_error("BadDtype", "{}: the offset tensor must be int32 or uint32, got {}".format(what, t.dtype))
    if t.size != 1:
        raise make_error("ShapeMismatch", "{}: the offset tensor must have one element, got shape {}".format(
            what, tuple(t.shape)))
    if t._ind is not None:
        raise make_error("DynamicIndex", "{}: the offset itself has a runtime index".format(what))


class Indirection:
    """The runtime part of an indirect (gather/scatter) view, spec §3.9: row p starts
    ``offsets[p] x stride`` (``offsets[0]`` when ``scalar``) elements after its static address; indices
    outside ``[0, bound)`` are out of bounds (``oob_mode``)."""

    __slots__ = ("offsets", "scalar", "bound", "stride", "dim")

    def __init__(self, offsets, scalar, bound, stride, dim=None):
        self.offsets, self.scalar, self.bound, self.stride = offsets, scalar, bound, stride
        self.dim = dim  # the storage dim a runtime select moves along (NkiTensor._dynamic), else None

    def fields(self, dst_side, oob_skip):
        """kernel.json fields of a dma_copy / tensor_copy with this indirection (see docs/kernel-json.md)."""
        flags = ["indirect_dst"] if dst_side else []
        if self.scalar:
            flags.append("indirect_scalar")
        if oob_skip:
            flags.append("oob_skip")
        return {"offsets": self.offsets.access(), "iimm": [self.bound, self.stride]}, flags


def _keep_view_dims(chip, dims, int_dims, kept):
    """The dims a view indexed by ints keeps (NkiTensor.__getitem__; ``dims``: the view's [start, size, step, kept],
    ``int_dims``: the dims an int or a loop index indexed, ``kept``: the dims the viewed tensor kept): on-chip views
    keep the partition dim and stay >= 2-D; HBM views drop int-indexed dims but stay >= 1-D (nki-api.md 3.8)."""
    if chip:
        if int_dims and int_dims[0] == 0 and kept and kept[0] == 0:
            dims[0][3] = True
        if len([d for d in dims if d[3]]) < 2:
            free_ints = [b for b in int_dims if b != 0]
            if free_ints:
                dims[free_ints[-1]][3] = True
    elif int_dims and not any(d[3] for d in dims):
        dims[int_dims[-1]][3] = True


class NkiTensor:
    """A tensor or a view of one. ``dims`` holds one entry per storage dim: [start, size, step, kept]."""

    __slots__ = ("_st", "_dims", "_tracer", "_ind", "_dt", "_shape", "_full", "_oob", "_regw", "__weakref__")

    def __init__(self, storage, dims=None, tracer=None):
        self._st = storage
        self._dims = dims if dims is not None else [[0, n, 1, True] for n in storage.shape]
        self._shape = None  # the shape, worked out when first asked (_dims never changes after this)
        self._full = None  # is_full(), likewise
        self._tracer = tracer
        self._ind = None  # Indirection of a runtime-addressed (gather/scatter) view, else None
        self._dt = None  # IR dtype name of a reinterpreting view (t.view(dtype), same element size), else None
        # the error of a register / int scalar_offset outside its dim (.ap): raised by the instruction using the
        # view, unless it is a dma_copy with oob_mode=skip (which then moves nothing)
        self._oob = None
        # labels of the register_loads whose registers address this view (.ap(scalar_offset=reg), nl.ds(reg, n)):
        # the instruction using it waits for them (kernel.json "after")
        self._regw = ()

    # --- properties ---------------------------------------------------------------------------
    @property
    def name(self):
        return self._st.name

    @property
    def buffer(self):
        return self._st.buffer

    @property
    def dtype(self):
        return np_dtype(self._dt or self._st.dtype)

    @property
    def shape(self):
        s = self._shape
        if s is None:
            s = self._shape = Shape([d[1] for d in self._dims if d[3]])
        return s

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(int(n) for n in self.shape)

    @property
    def itemsize(self):
        return self.dtype.itemsize

    def is_full(self):
        f = self._full
        if f is None:
            f = self._full = self._is_full()
        return f

    def _is_full(self):
        if isinstance(self._st, _ViewStorage):
            return False
        for d, n in zip(self._dims, self._st.shape):
            s = d[0]
            if isinstance(s, Sym) or s != 0 or d[1] != n or d[2] != 1 or not d[3]:
                return False
        return True

    def __repr__(self):
        return "NkiTensor({}, shape={}, dtype={}, buffer={})".format(self.name, tuple(self.shape), self._st.dtype,
                                                                    self.buffer)

    def __bool__(self):
        if self.size == 1:  # eager mode: a one-element tensor has a truth value, like numpy's
            # (an `if` on it is control flow on a tensor's value, which the NKI compiler rejects: nki-api.md 1.7,
            # err_dynamic_control_flow_not_supported; nsim keeps it for debugging and says so)
            nki_warn("if / while / bool() on the value of tensor '{}': the NKI compiler rejects control flow on tensor "
                     "values (err_dynamic_control_flow_not_supported); nsim reads the value (eager mode, for "
                     "debugging)".format(self.name), stacklevel=2)
            return bool(self.numpy().reshape(-1)[0])
        raise make_error("TensorTruthValue", "the truth value of a tensor of {} elements is ambiguous (use "
                         "np.asarray(t).any() / .all() on its values)".format(self.size))

    # --- values (eager mode: the ops traced so far run in the C++ core when a value is first asked for)
    def numpy(self):
        """The current values of this tensor (view) as a numpy array: the numerics of every instruction
        traced so far, computed by the simulator core (debugging: print, pdb, branching on values)."""
        tr = self._tracer if self._tracer is not None else active()
        if tr is None:
            raise make_error("ValuesUnavailable", "the values of '{}' are only known while its kernel "
                             "runs".format(self.name))
        return tr.eager().values(self)

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def item(self):
        a = self.numpy()
        if a.size != 1:
            raise make_error("ItemNotScalar", "item(): '{}' has {} elements, not 1".format(self.name, a.size))
        return a.reshape(-1)[0].item()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __str__(self):
        try:
            vals = self.numpy()
        except Exception as e:  # values unavailable (outside a kernel, a view without values): say why
            return "{} (values unavailable: {})".format(repr(self), getattr(e, "message", e))
        if vals.dtype.kind not in "biuf":  # bf16 / fp8 (ml_dtypes) print as float32
            vals = vals.astype(np.float32)
        return "{} {} {} ({}):\n{}".format(self.name, tuple(self.shape), self._st.dtype, self.buffer, vals)

    def _ragged_fix(self, tile, rows, cols):
        """How a kernel of this dialect takes the last, partial tile of ``tile`` rows of this 2-D tensor of ``rows``
        rows and ``cols`` columns (the hint of a slice past its end): the new dialect's tutorials clip the slices."""
        return ("clip the slices, e.g. p = min({t}, {r} - i * {t}); src={n}[i * {t}:i * {t} + p, :] into "
                "dst=tile[0:p, :]".format(t=tile, r=rows, n=self.name))

    # --- views --------------------------------------------------------------------------------
    def _plain_view(self, key):
        """``self[key]`` for the common subscripts, else None (__getitem__ then works it out, and raises what is
        wrong): ints, loop indices, slices with int (or no) bounds and no step, and ``nl.ds`` with an int or
        loop-index start (no register, no runtime start), each in range (for a loop index, in every iteration), at
        most one per kept dim; no ellipsis. The view __getitem__ makes of them, without its scans for the forms
        these are not. (Nothing here raises or changes state: a subscript it does not take leaves the work to
        __getitem__, errors included.)"""
        dims = [list(d) for d in self._dims]
        kept = [i for i, d in enumerate(dims) if d[3]]
        if len(key) > len(kept):
            return None
        int_dims = []
        for bi, k in zip(kept, key):
            d = dims[bi]
            size = d[1]
            tk = type(k)
            if tk is slice:
                if k.step is not None:
                    return None
                a, b = k.start, k.stop
                if a is None:
                    a = 0
                elif type(a) is not int:
                    return None
                if b is None:
                    b = size
                elif type(b) is not int:
                    return None
                if not 0 <= a < b <= size:
                    return None
                d[0] = d[0] + a * d[2]
                d[1] = b - a
                continue
            if tk is Sym:
                k = k.resolved()  # (an int once its loops are done)
                tk = type(k)
            if tk is Sym or tk is int:
                if not (0 <= k.lo() and k.hi() < size if tk is Sym else 0 <= k < size):
                    return None
                d[0] = d[0] + k * d[2]
                d[1] = 1
                d[3] = False
                int_dims.append(bi)
            elif tk is DynSlice:
                if k.loads:
                    return None
                a, n, st = k.start, k.size, k.step
                if n < 1 or st < 1:
                    return None
                if type(a) is Sym:
                    a = a.resolved()
                if type(a) is Sym:
                    if a.lo() < 0 or a.hi() + (n - 1) * st >= size:
                        return None
                elif type(a) is not int or a < 0 or a + (n - 1) * st >= size:
                    return None
                d[0] = d[0] + a * d[2]
                d[1] = n
                d[2] = d[2] * st
            else:
                return None
        _keep_view_dims(self._st.buffer in ON_CHIP, dims, int_dims, kept)
        return self._derive(self._st, dims, keep_ind=True)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        v = self._plain_view(key)
        if v is not None:
            return v
        kept = [i for i, d in enumerate(self._dims) if d[3]]
        n_ell = 0
        for k in key:  # (by identity: `in` would call a Sym's or a tensor's __eq__)
            if k is Ellipsis:
                n_ell += 1
        if n_ell > 1:
            raise make_error("BadSubscript", "an index can only have a single ellipsis ('...')")
        if n_ell:
            i = next(j for j, k in enumerate(key) if k is Ellipsis)
            fill = len(kept) - (len(key) - 1)
            key = key[:i] + (slice(None),) * max(fill, 0) + key[i + 1:]
        if len(key) > len(kept):
            raise make_error("BadSubscript", "too many indices for tensor '{}' of shape {}: {}".format(
                self.name, tuple(self.shape), len(key)))
        key = key + (slice(None),) * (len(kept) - len(key))
        dims = [list(d) for d in self._dims]
        chip = self._st.buffer in ON_CHIP
        int_dims = []
        runtime = [(vd, k) for vd, k in enumerate(key) if type(k) is DynSlice and isinstance(k.start, NkiTensor)]
        if runtime:  # nl.ds(tile_value, size): the static view at start 0, then the runtime offset along that dim
            if len(runtime) > 1:
                raise make_error("DynamicIndex", "tensor '{}': one runtime index per view (spec §3.9), got {}".format(
                    self.name, len(runtime)))
            vd, k = runtime[0]
            key = list(key)
            key[vd] = DynSlice(0, k.size, k.step)
            return self[tuple(key)]._dynamic(kept[vd], k.start)
        for vd, (bi, k) in enumerate(zip(kept, key)):
            start, size, step, _ = dims[bi]
            if type(k) is slice and k.step is None and type(k.start) is int and type(k.stop) is int and \
                    0 <= k.start < k.stop <= size:  # the common case, [a:b] with ints in bounds (as below)
                dims[bi] = [start + k.start * step, k.stop - k.start, step, True]
                continue
            if type(k) is slice and k.start is None and k.stop is None and k.step is None:  # [:]
                dims[bi] = [start, size, step, True]
                continue
            if isinstance(k, (bool, np.bool_)):
                raise make_error("BadSubscript", "boolean index not supported")
            if isinstance(k, Sym):
                k = k.resolved()
                if isinstance(k, Sym):  # a symbolic index: in bounds for every iteration, else unrolled
                    if k.lo() < 0 or k.hi() >= size:
                        k._need("an index that is negative or out of bounds in some iteration")
                    dims[bi] = [start + k * step, 1, step, False]
                    int_dims.append(bi)
                    continue
            if isinstance(k, (int, np.integer)):
                i = int(k)
                if i < 0:
                    i += size
                if not 0 <= i < size:
                    raise make_error("IndexOutOfBounds", "index {} is out of bounds for dim {} of size {} "
                                     "of tensor '{}'".format(int(k), vd, size, self.name))
                dims[bi] = [start + i * step, 1, step, False]
                int_dims.append(bi)
                continue
            if isinstance(k, DynSlice):
                a, n, s = k.start, k.size, k.step
                if isinstance(a, Sym):
                    a = a.resolved()
                if isinstance(a, Sym):
                    if a.lo() < 0 or n < 1 or s < 1 or a.hi() + (n - 1) * s >= size:
                        a._need("an nl.ds out of bounds in some iteration")
                elif a < 0 or n < 1 or s < 1 or a + (n - 1) * s >= size:
                    raise make_error("IndexOutOfBounds", "nl.ds({}, {}) is out of bounds for dim {} of size {} "
                                     "of tensor '{}'".format(a, n, vd, size, self.name))
            elif isinstance(k, slice):
                s = 1 if k.step is None else int(k.step)
                if s < 1:
                    raise make_error("BadSubscript", "slice step must be >= 1, got {}".format(s))
                a = 0 if k.start is None else _idx(k.start)
                b = size if k.stop is None else _idx(k.stop)
                if isinstance(a, Sym) or isinstance(b, Sym):  # symbolic bounds: a constant size, in bounds
                    n = b - a
                    if isinstance(n, Sym) or n < 1:
                        (a if isinstance(a, Sym) else b)._need("a slice of a size that depends on it")
                    lo = a.lo() if isinstance(a, Sym) else a
                    hi = b.hi() if isinstance(b, Sym) else b
                    if lo < 0 or hi > size:
                        (a if isinstance(a, Sym) else b)._need("a slice out of bounds in some iteration")
                    dims[bi] = [start + a * step, (n + s - 1) // s, step * s, True]
                    continue
                if a < 0:
                    a += size
                if b < 0:
                    b += size
                if a < 0 or b > size or a >= b:
                    # (a last tile of rows reaching past the end: rows not a multiple of the tile's, the usual case)
                    shp = tuple(self.shape)
                    tail = vd == 0 and 0 <= a < size < b and len(shp) == 2
                    raise make_error("IndexOutOfBounds", "slice {}:{} is out of bounds (or empty) for dim {} "
                                     "of size {} of tensor '{}'{}".format(
                                         k.start, k.stop, vd, size, self.name,
                                         ": the last tile of rows has {} of them; {}".format(
                                             size - a, self._ragged_fix(b - a, size, shp[1])) if tail else ""))
                n = (b - a + s - 1) // s
            else:
                raise make_error("BadSubscript", "unsupported index {!r} (use ints, slices, nl.ds or "
                                 "...)".format(k))
            dims[bi] = [start + a * step, n, step * s, True]
        _keep_view_dims(chip, dims, int_dims, kept)
        v = self._derive(self._st, dims, keep_ind=True)
        loads = tuple(lbl for k in key if type(k) is DynSlice for lbl in k.loads)
        if loads:
            v._regw = tuple(dict.fromkeys(v._regw + loads))
        return v

    def broadcast(self, dim, size):
        """A view where the size-1 view dim ``dim`` is repeated ``size`` times (stride 0)."""
        kept = [i for i, d in enumerate(self._dims) if d[3]]
        nd = len(kept)
        dim = int(dim) + nd if int(dim) < 0 else int(dim)
        if not 0 <= dim < nd or self._dims[kept[dim]][1] != 1:
            raise make_error("BadBroadcast", "broadcast: dim {} of shape {} must exist and have size "
                             "1".format(dim, tuple(self.shape)))
        if dim == 0 and self._st.buffer in ON_CHIP:
            raise make_error("BadBroadcast", "broadcast: the partition dim of an on-chip tensor cannot "
                             "be broadcast by a view (use nc_stream_shuffle, a matmul or nl.broadcast_to)")
        dims = [list(d) for d in self._dims]
        dims[kept[dim]][1] = int(size)
        dims[kept[dim]][2] = 0 if int(size) > 1 else 1
        return self._derive(self._st, dims)

    def _view(self, dims):
        return self._derive(self._st, dims)

    def _dynamic(self, bi, index):
        """This view with a runtime offset along storage dim ``bi``: at run time every element moves by
        ``index`` (the value of a one-element on-chip int32/uint32 tensor) positions along that dim (spec §3.9
        ``scalar_offset``; Beta 1 ``t[i_p, idx_tile[0, 0] + i_f]``, ``nl.ds(idx_tile[0, 0], n)``). The valid values
        are [0, bound): every element stays inside dim ``bi`` (an index outside is an error when the
        instruction runs, IndexOutOfBounds). Only dma_copy (HBM) and tensor_copy (on chip) take such a view."""
        _check_offset_tensor(index, "a runtime index")
        if isinstance(self._st, _ViewStorage):
            raise make_error("DynamicIndex", "a runtime index on a re-dimensioned view (reshape, arange window) of "
                             "'{}' is not supported: index the tensor itself".format(self.name))
        chip = self._st.buffer in ON_CHIP
        if chip and bi == 0:
            raise make_error("DynamicIndex", "a runtime index on the partition dim of the on-chip tensor '{}' is not "
                             "supported (the runtime address moves within each partition)".format(self.name))
        if self._ind is not None:
            raise make_error("DynamicIndex", "tensor '{}': one runtime index per view (spec §3.9)".format(self.name))
        start, size, step, kept = self._dims[bi]
        if isinstance(start, Sym):
            start = start.resolved()
            if isinstance(start, Sym):
                start._need("a runtime index next to a loop index on the same dim")
        last = start + (size - 1) * step if kept else start
        bound = int(self._st.shape[bi]) - int(last)
        stride = int(np.prod(self._st.shape[bi + 1:], dtype=np.int64))
        if bound < 1 or stride > _INT32_MAX:
            raise make_error("IndexOutOfBounds", "the static part of the runtime-indexed view of '{}' leaves no room "
                             "along dim {}".format(self.name, bi))
        v = self._derive(self._st, [list(d) for d in self._dims])
        v._ind = Indirection(index, True, bound, stride, bi)
        return v

    def _static(self):
        """The static part of a runtime-indexed view (the view at runtime offset 0)."""
        v = type(self)(self._st, [list(d) for d in self._dims], self._tracer)
        v._dt = self._dt
        v._regw = self._regw
        return v

    def _derive(self, storage, dims, keep_ind=False):
        """A new view of this one. An indirect view's rows are runtime values: no view of it can be taken, except
        (``keep_ind``) a view of some of its elements (indexing, slicing, permute, reshape) when the whole view
        moves by one runtime offset of an HBM tensor (``select(dim, tensor)``, ``.ap(scalar_offset=)``): the
        sub-view moves by the same offset, and the valid offsets of the whole view stay valid for it."""
        if self._ind is not None and not (keep_ind and self._ind.scalar and self._ind.dim is None):
            raise make_error("NotSupported", "a view of the indirect (runtime-indexed) view of '{}' cannot be "
                             "taken: apply .ap(vector_offset=/scalar_offset=) or vector_select last".format(self.name))
        v = type(self)(storage, dims, self._tracer)
        v._dt = self._dt  # views of a reinterpreting view keep its dtype
        v._oob = self._oob
        v._ind = self._ind
        v._regw = self._regw
        return v

    def __setitem__(self, key, value):
        raise make_error("ItemAssignment", "item assignment on tensors is not part of the new NKI dialect; "
                         "write through an nisa instruction (e.g. nisa.tensor_copy(dst=t[...], src=x))")

    def __len__(self):
        return self.shape[0]

    def __iter__(self):
        raise make_error("TensorNotIterable", "tensors are not iterable while tracing (their values are: "
                         "iterate over np.asarray(t) or t.numpy())")

    # --- re-dimensioning views (reshape, view(dtype), broadcast_to, ...) -----------------------------
    def _flat(self):
        """(real storage, offset, [(stride, count)] per view dim) of this view, strides in elements of the
        real storage's row-major layout."""
        st = self._st
        if isinstance(st, _ViewStorage):
            base, off, R = st.base, st.offset, st.strides
        else:
            base, off, R = st, 0, _rowmajor(st.shape)
        pat = []
        for k, (start, size, step, kept) in enumerate(self._dims):
            off += start * R[k]
            if kept:
                pat.append((step * R[k], size))
        return base, off, pat

    def _pattern_view(self, offset, pat, keep_ind=False):
        """A view of the elements ``offset + sum stride_k * i_k`` of this view's real storage."""
        base = self._st.base if isinstance(self._st, _ViewStorage) else self._st
        vs = _ViewStorage(base, offset, [s for s, _ in pat], [c for _, c in pat])
        return self._derive(vs, None, keep_ind)

    def reshape(self, *shape):
        """A view of the same elements (row-major order) with another shape (one ``-1`` allowed). Works on
        HBM tensors and on-chip tiles (the partition dim must stay dim 0 with the same size) wherever the
        view's layout allows it without a copy."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, Shape)):
            shape = tuple(shape[0])
        shape = [int(x) for x in shape]
        n = self.size
        if shape.count(-1) > 1:
            raise make_error("BadReshape", "reshape: only one dim can be -1, got {}".format(shape))
        if -1 in shape:
            rest = int(np.prod([x for x in shape if x != -1], dtype=np.int64))
            if rest <= 0 or n % rest:
                raise make_error("BadReshape", "reshape: cannot reshape {} elements into {}".format(
                    n, tuple(shape)))
            shape[shape.index(-1)] = n // rest
        if any(x < 1 for x in shape) or int(np.prod(shape, dtype=np.int64)) != n:
            raise make_error("BadReshape", "reshape: cannot reshape shape {} ({} elements) into {} "
                             "(the element count must not change)".format(tuple(self.shape), n, tuple(shape)))
        chip = self._st.buffer in ON_CHIP
        if chip and (len(shape) < 2 or shape[0] != self.shape[0]):
            raise make_error("BadReshape", "reshape of the on-chip tensor '{}' from {} to {}: the "
                             "partition dim (dim 0, size {}) must stay dim 0 with the same size, with at least "
                             "one free dim".format(self.name, tuple(self.shape), tuple(shape), self.shape[0]))
        if tuple(shape) == tuple(self.shape):
            return self
        _base, off, pat = self._flat()
        items = [[s, c] for s, c, _ in _merge(pat)]
        new = []
        i = 0
        for d in shape:
            if d == 1:
                new.append((0, 1))
                continue
            while i < len(items) and items[i][1] == 1:
                i += 1
            if i >= len(items) or items[i][1] % d:
                raise make_error("BadReshape", "reshape of '{}' from {} to {}: the view's layout is not "
                                 "contiguous where the new shape needs it (copy it into a fresh tile first)".format(
                                     self.name, tuple(self.shape), tuple(shape)))
            items[i][1] //= d
            new.append((items[i][0] * items[i][1], d))
        if chip and self.shape[0] > 1:
            v0 = self._flat()[2][0]
            if new[0] != v0:
                raise make_error("BadReshape", "reshape of the on-chip tensor '{}' from {} to {} would "
                                 "move elements across partitions".format(self.name, tuple(self.shape),
                                                                          tuple(shape)))
        return self._pattern_view(off, new, keep_ind=True)

    def reshape_dim(self, dim, shape):
        """Split view dim ``dim`` into ``shape`` (one -1 allowed)."""
        s = list(self.shape)
        dim = int(dim) + len(s) if int(dim) < 0 else int(dim)
        return self.reshape(s[:dim] + list(shape) + s[dim + 1:])

    def flatten_dims(self, start_dim, end_dim):
        s = list(self.shape)
        a = int(start_dim) + len(s) if int(start_dim) < 0 else int(start_dim)
        b = int(end_dim) + len(s) if int(end_dim) < 0 else int(end_dim)
        return self.reshape(s[:a] + [int(np.prod(s[a:b + 1], dtype=np.int64))] + s[b + 1:])

    def expand_dim(self, dim):
        s = list(self.shape)
        dim = int(dim) + len(s) + 1 if int(dim) < 0 else int(dim)
        return self.reshape(s[:dim] + [1] + s[dim:])

    def squeeze_dim(self, dim):
        s = list(self.shape)
        dim = int(dim) + len(s) if int(dim) < 0 else int(dim)
        if s[dim] != 1:
            raise make_error("BadView", "squeeze_dim: dim {} of shape {} is not 1".format(
                dim, tuple(s)))
        return self.reshape(s[:dim] + s[dim + 1:])

    def view(self, dtype):
        """``t.view(dtype)``: the same bytes as ``dtype`` (a kernel-IR access with a ``dtype``; spec §3.9), as numpy's
        ``a.view(dtype)``: of the same element size the same shape (packed uint32 data as ``nl.float8_e4m3fn_x4``),
        of another size the last dim scaled by the ratio of the sizes (a [128, 512] bf16 tile as float32 is
        [128, 256]), which must then be contiguous with a whole number of elements of the new size. The same dtype
        is the view itself."""
        name = dtype_name(dtype)
        nd = np_dtype(name)
        if nd == self.dtype:
            return self
        if nd.itemsize == self.dtype.itemsize:
            v = self._derive(self._st, [list(d) for d in self._dims])
            v._dt = None if name == self._st.dtype else name
            return v
        what = "{}.view({})".format(self.name, name)
        if self._ind is not None:
            raise make_error("NotSupported", "{}: a runtime-indexed view cannot change its element size (view the "
                             "tensor first, then index it)".format(what))
        b, off, pat = self._flat()
        ub, vb = np_dtype(b.dtype).itemsize, nd.itemsize
        if not pat or (pat[-1][1] > 1 and pat[-1][0] != 1):
            raise make_error("BadView", "{}: the last dim of the view {} must be contiguous (its stride is {} "
                             "elements)".format(what, tuple(self.shape), pat[-1][0] if pat else 0))
        if (pat[-1][1] * ub) % vb:
            raise make_error("BadDtype", "{}: the last dim of the view {} holds {} bytes, not a whole number of "
                             "{}-byte {} elements (the view scales the last dim by the ratio of the element "
                             "sizes)".format(what, tuple(self.shape), pat[-1][1] * ub, vb, name))
        for st_, n in pat[:-1]:
            if n > 1 and (st_ * ub) % vb:
                raise make_error("BadView", "{}: a stride of {} bytes of the view {} is not a whole number of {}-byte "
                                 "elements".format(what, st_ * ub, tuple(self.shape), vb))
        r, noff = _retype(b, off, name, what)
        npat = [((st_ * ub) // vb if n > 1 else 0, n) for st_, n in pat[:-1]] + [(1, pat[-1][1] * ub // vb)]
        v = self._derive(_ViewStorage(r, noff, [x for x, _ in npat], [c for _, c in npat]), None)
        v._dt = name if isinstance(r, _RetypedStorage) else None  # (back to the real tensor's own dtype: None)
        return v

    def broadcast_to(self, shape):
        """A stride-0 view of this tensor broadcast to ``shape`` (numpy rules, but a lower-rank tensor is
        padded with trailing size-1 dims, spec §3.10). The partition dim of an on-chip tile cannot be
        broadcast by a view (``nl.broadcast_to`` copies it)."""
        shape = tuple(int(x) for x in shape)
        cur = tuple(self.shape)
        v = self
        if len(cur) < len(shape):
            v = v.reshape(cur + (1,) * (len(shape) - len(cur)))
            cur = tuple(v.shape)
        if len(cur) != len(shape) or any(a != b and a != 1 for a, b in zip(cur, shape)):
            raise make_error("BadBroadcast", "broadcast_to: shape {} does not broadcast to {}".format(
                tuple(self.shape), shape))
        for d, (a, b) in enumerate(zip(cur, shape)):
            if a != b:
                v = v.broadcast(d, b)
        return v

    def slice(self, dim, start, end, step=1):
        """``t.slice(dim, start, end, step=1)``: the view with dim ``dim`` restricted to start:end:step."""
        key = [slice(None)] * self.ndim
        dim = int(dim) + self.ndim if int(dim) < 0 else int(dim)
        key[dim] = slice(int(start), int(end), int(step))
        return self[tuple(key)]

    def select(self, dim, index):
        """``t.select(dim, index)``: the view without dim ``dim`` at ``index`` (an int, or a ``(1, 1)`` SBUF
        int tensor for a runtime select on an HBM tensor: a ``scalar_offset`` access, spec §3.9)."""
        if isinstance(index, NkiTensor):
            d = int(dim) + self.ndim if int(dim) < 0 else int(dim)
            kept = [i for i, e in enumerate(self._dims) if e[3]]
            if isinstance(self._st, _ViewStorage) or not 0 <= d < len(kept):
                raise make_error("NotSupported", "select(dim, tensor): a runtime select needs a plain (sliced) "
                                 "tensor and an existing dim, got {} of shape {}".format(dim, tuple(self.shape)))
            if self._dims[kept[d]][2] != 1:
                raise make_error("NotSupported", "select(dim, tensor): a runtime select on a strided dim")
            fixed = self.select(d, 0)  # the view at its first position along dim; the index counts from there
            return fixed.ap(fixed.get_pattern(), scalar_offset=index, indirect_dim=kept[d])
        key = [slice(None)] * self.ndim
        dim = int(dim) + self.ndim if int(dim) < 0 else int(dim)
        key[dim] = int(index)
        v = self[tuple(key)]
        if v.ndim == self.ndim and self.ndim > 1:  # an on-chip view kept the dim: drop it as a reshape
            shp = list(v.shape)
            del shp[dim]
            if len(shp) >= (2 if self.buffer in ON_CHIP else 1):
                v = v.reshape(shp)
        return v

    def permute(self, dims):
        """``t.permute(dims)``: a view with the dims reordered (on-chip: ``dims[0] == 0``). Its kernel-IR access
        exists when the result still visits the storage in row-major order (e.g. moving size-1 dims)."""
        dims = [int(d) + self.ndim if int(d) < 0 else int(d) for d in dims]
        if sorted(dims) != list(range(self.ndim)):
            raise make_error("BadView", "permute: {} is not a permutation of {} dims".format(
                dims, self.ndim))
        if self.buffer in ON_CHIP and dims[0] != 0:
            raise make_error("BadView", "permute: the partition dim of an on-chip tensor must stay "
                             "first (dims[0] == 0)")
        _base, off, pat = self._flat()
        return self._pattern_view(off, [pat[d] for d in dims], keep_ind=True)

    def rearrange(self, src_pattern, dst_pattern, fixed_sizes=None):
        """``t.rearrange(src_pattern, dst_pattern, fixed_sizes=None)`` (spec §3.9): einops-style split, permute
        and merge as a view. ``src_pattern`` names each dim of this view: a name, or a tuple of names for a dim
        split row-major into those axes (``('h', 'w')``; at most one size per group unknown, the others from
        ``fixed_sizes``); ``dst_pattern`` lists every axis once, a tuple merging axes into one dim (``()`` is a
        size-1 dim). E.g. ``t.rearrange(('b', ('h', 'w')), ('b', 'w', 'h'), {'h': 4})`` is
        ``np.transpose(t.reshape(b, 4, w), (0, 2, 1))``. It is ``reshape`` (split), ``permute``, ``reshape``
        (merge), so their rules apply: on chip the partition axis stays first and alone; a merge needs the
        permuted axes adjacent in memory (BadReshape). A permutation of the tensor's own dims is an access with
        an ``order`` (docs/kernel-json.md); a view that splits one dim of the tensor and moves the parts apart
        (the example above on a 2-D tensor) is an access with a ``shape`` (the tensor re-dimensioned, then
        permuted: ``ir_redim``)."""
        fixed = dict(fixed_sizes or {})
        src, dst = list(src_pattern), list(dst_pattern)
        shape = tuple(self.shape)
        where = "rearrange({!r}, {!r})".format(tuple(src), tuple(dst))
        if len(src) != len(shape):
            raise make_error("BadView", "{}: the source pattern names {} dims, the tensor has shape {}".format(
                where, len(src), shape))

        def names(item):
            if isinstance(item, str):
                return [item]
            if isinstance(item, (tuple, list)) and all(isinstance(x, str) for x in item):
                return list(item)
            raise make_error("BadView", "{}: a pattern item is a name or a tuple of names, got {!r}".format(
                where, item))

        sizes, order = {}, []
        for item, n in zip(src, shape):
            group = names(item)
            if any(g in sizes or g in order for g in group) or len(set(group)) != len(group):
                raise make_error("BadView", "{}: an axis is named twice in the source pattern".format(where))
            unknown = [g for g in group if g not in fixed]
            known = int(np.prod([int(fixed[g]) for g in group if g in fixed], dtype=np.int64))
            if len(unknown) > 1:
                raise make_error("BadView", "{}: the sizes of {} are unknown (give all but one in fixed_sizes)".format(
                    where, unknown))
            if known < 1 or n % known or (not unknown and known != n):
                raise make_error("BadView", "{}: dim of size {} does not split into {}".format(
                    where, n, {g: fixed.get(g, "?") for g in group}))
            for g in group:
                sizes[g] = int(fixed[g]) if g in fixed else n // known
            order += group
        extra = set(fixed) - set(sizes)
        if extra:
            raise make_error("BadView", "{}: fixed_sizes names {} that the source pattern does not".format(
                where, sorted(extra)))
        dst_names = [g for item in dst for g in names(item)]
        if sorted(dst_names) != sorted(order):
            raise make_error("BadView", "{}: the destination pattern must list the axes {} once each, got {}".format(
                where, order, dst_names))
        chip = self.buffer in ON_CHIP
        if chip and (not isinstance(src[0], str) or names(dst[0]) != [src[0]]):
            raise make_error("BadView", "{}: the partition dim of an on-chip tensor must stay the first dim, alone "
                             "(first item of both patterns, the same name)".format(where))
        v = self.reshape([sizes[g] for g in order])  # the split (the view itself when nothing splits)
        perm = [order.index(g) for g in dst_names]
        if perm != sorted(perm):
            v = v.permute(perm)
        out = [int(np.prod([sizes[g] for g in names(item)], dtype=np.int64)) for item in dst]
        return v.reshape(out) if tuple(out) != tuple(v.shape) else v

    @property
    def T(self):  # noqa: N802 - NKI name
        if self.ndim != 2:
            raise make_error("BadView", ".T needs a 2-D tensor, got shape {}".format(tuple(self.shape)))
        return self.permute((1, 0))

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
        """``t.ap([[step, num], ...], offset=None)``: an explicit access pattern over the storage (spec §3.9):
        element ``(i0, ...)`` is ``storage_flat[view offset + offset + sum step_j * i_j]``.

        Runtime offsets (gather/scatter on an HBM tensor, one per view; spec §3.9): ``vector_offset`` (an
        SBUF ``(P, 1)`` int tensor, ``indirect_dim=0``) makes row p start ``vector_offset[p] x prod(shape[1:])``
        elements after ``offset`` (the pattern's first step is ignored); ``scalar_offset`` (a ``(1, 1)`` SBUF
        int tensor, or a VirtualRegister / int, whose value is known while tracing) adds
        ``value x prod(shape[indirect_dim+1:])`` to the start."""
        base = self
        if dtype is not None and np_dtype(dtype_name(dtype)).itemsize != self.dtype.itemsize:
            # the storage's bytes as elements of the new size: offset and steps count those (spec §3.9)
            if self._ind is not None:
                raise make_error("NotSupported", ".ap(dtype=) of another element size on a runtime-indexed view")
            b, off, _pat = self._flat()
            r, off = _retype(b, off, dtype_name(dtype), ".ap(dtype={})".format(dtype_name(dtype)))
            base = self._derive(r, None)
            base._dt = dtype_name(dtype) if isinstance(r, _RetypedStorage) else None
            b = r
        else:
            if dtype is not None:
                base = self.view(dtype)
            b, off, _pat = base._flat()
        pat = [(int(p[0]), int(p[1])) for p in pattern]
        if not pat or any(n < 1 for _, n in pat):
            raise make_error("BadView", ".ap: bad pattern {}".format(pattern))
        off += offset if isinstance(offset, Sym) else int(offset or 0)
        if scalar_offset is None and vector_offset is None:
            return base._pattern_view(off, pat)
        off = int(off)  # (a runtime offset on a view moved by a loop index: the loop is unrolled)
        if scalar_offset is not None and vector_offset is not None:
            raise make_error("BadView", ".ap: scalar_offset and vector_offset are mutually exclusive")
        d = int(indirect_dim)
        # The tensor's shape: a whole-tensor reshape is a tensor of its own shape (as in NKI), else the storage's.
        shp = tuple(base.shape) if base.size == int(np.prod(b.shape, dtype=np.int64)) and base.is_contiguous() \
            else tuple(b.shape)
        if not 0 <= d < len(shp):
            raise make_error("BadView", ".ap: indirect_dim {} is not a dim of shape {}".format(d, shp))
        stride = int(np.prod(shp[d + 1:], dtype=np.int64))
        chip = b.buffer != "hbm"
        if vector_offset is None and isinstance(scalar_offset, (VirtualRegister, int, np.integer)):
            # a register (or int) offset is known at trace time: a static access, but still one along dim d
            # (spec §3.9): a value outside it is out of bounds (oob_mode of the instruction), not the next rows
            val = register_value(scalar_offset, ".ap(scalar_offset=)")
            bound = self._ap_bound(b, shp, off, pat, d, stride, chip)
            loads = register_loads(scalar_offset)
            if 0 <= val < bound:
                v = base._pattern_view(off + val * stride, pat)
                v._regw = tuple(dict.fromkeys(v._regw + loads))
                return v
            v = base._pattern_view(off, pat)  # (never transferred)
            v._regw = tuple(dict.fromkeys(v._regw + loads))
            v._oob = ("err_tensor_access_out_of_bound: .ap(scalar_offset=) value {} is outside [0, {}) along dim {} "
                      "of tensor '{}' {} (oob_mode=error; oob_mode=skip skips the transfer)".format(
                          val, bound, d, b.name, shp))
            return v
        if chip and vector_offset is not None:
            raise make_error("NotSupported", ".ap(vector_offset=) on the on-chip tensor '{}' ({}): vector offsets "
                             "select HBM rows (an on-chip view takes a scalar_offset)".format(b.name, b.buffer))
        if chip and d == 0:
            raise make_error("DynamicIndex", ".ap(scalar_offset=) on the on-chip tensor '{}': the runtime offset "
                             "cannot move along the partition dim (indirect_dim 0)".format(b.name))
        idx = vector_offset if vector_offset is not None else scalar_offset
        what = "vector_offset" if vector_offset is not None else "scalar_offset"
        if not isinstance(idx, NkiTensor) or idx.buffer not in ON_CHIP:
            raise make_error("BadOperandKind", ".ap({}=): needs an SBUF int32/uint32 tensor or a VirtualRegister, "
                             "got {!r}".format(what, idx))
        if np.dtype(idx.dtype) not in (np.dtype(np.int32), np.dtype(np.uint32)):
            raise make_error("BadDtype", ".ap({}=): offsets must be int32 or uint32, got {}".format(what, idx.dtype))
        if vector_offset is not None:
            if d != 0:
                raise make_error("BadView", ".ap(vector_offset=) needs indirect_dim=0, got {}".format(d))
            if tuple(idx.shape) != (pat[0][1], 1):
                raise make_error("ShapeMismatch", ".ap(vector_offset=): offsets must be ({}, 1), one row index per "
                                 "row of the pattern, got {}".format(pat[0][1], tuple(idx.shape)))
            pat[0] = (0, pat[0][1])
        elif idx.size != 1:
            raise make_error("ShapeMismatch", ".ap(scalar_offset=): needs a (1, 1) tensor, got {}".format(
                tuple(idx.shape)))
        bound = self._ap_bound(b, shp, off, pat, d, stride, chip)
        if bound < 1 or stride > _INT32_MAX:
            raise make_error("IndexOutOfBounds", ".ap: the static pattern of '{}' leaves no room for a runtime "
                             "offset along dim {}".format(b.name, d))
        v = base._pattern_view(off, pat)
        v._ind = Indirection(idx, vector_offset is None, bound, stride, d if chip else None)
        return v

    @staticmethod
    def _ap_bound(b, shp, off, pat, d, stride, chip):
        """The runtime offsets along dim ``d`` that keep ``.ap``'s pattern inside the storage: [0, bound)."""
        if chip:  # within each partition: the free elements of the storage
            total = int(np.prod(shp[1:], dtype=np.int64))
            last = off % total + sum(s * (n - 1) for s, n in pat[1:])
        else:
            total = int(np.prod(shp, dtype=np.int64))
            last = off + sum(s * (n - 1) for s, n in pat)
        return min(int(shp[d]), (total - 1 - last) // stride + 1 if stride else int(shp[d]))

    def get_pattern(self):
        """The view as ``[[stride, count], ...]`` (elements of the storage)."""
        return [[s if c > 1 else 0, c] for s, c in self._flat()[2]]

    @property
    def strides(self):
        """The stride of each dim of the view, in elements of its storage (nki-api.md 3.9), as get_pattern()."""
        return tuple(s for s, _c in self._flat()[2])

    @property
    def offset(self):
        """The view's first element, in elements from the start of its storage (nki-api.md 3.9; an expression of
        the loop index in a loop recorded once)."""
        return self._flat()[1]

    def is_contiguous(self):
        """Row-major dense (the partition dim of an on-chip view ignored)."""
        pat = self._flat()[2]
        if self.buffer in ON_CHIP:
            pat = pat[1:]
        items = _merge(pat)
        return not items or (len(items) == 1 and items[0][0] == 1)

    def is_indirect(self):
        return self._ind is not None

    def vector_select(self, dim, vector_offset):
        """``t.vector_select(0, offsets)`` (HBM): partition p reads row ``offsets[p]`` of this view's rows."""
        if int(dim) != 0:
            raise make_error("BadView", "vector_select: dim must be 0, got {}".format(dim))
        pat = self._flat()[2]
        n = vector_offset.shape[0] if isinstance(vector_offset, NkiTensor) else 1
        return self.ap([(0, int(n))] + list(pat[1:]), vector_offset=vector_offset)

    def reinterpret_cast(self, dtype):
        return self.view(dtype)

    # --- IR access ----------------------------------------------------------------------------
    def access(self, indirect_ok=False):
        """The operand of this view in kernel.json (a name, or {"tensor", "index"[, "order"][, "dtype"]}). A
        runtime-indexed view (``_ind``) gives its static part only: the instructions that take one (dma_copy,
        tensor_copy) ask for it with ``indirect_ok`` and add the runtime fields; every other use is a DynamicIndex
        error."""
        if self._oob is not None:
            raise make_error("IndexOutOfBounds", self._oob)
        if getattr(self, "_opmask", None) is not None:
            raise make_error("NotSupported", "an operand mask t[cond] (spec 3.8) restricts an nc_matmul / nl.matmul "
                             "operand only; give other instructions mask=cond")
        if self._ind is not None and not indirect_ok:
            raise make_error("DynamicIndex", "the view of '{}' has a runtime (SBUF-valued) index: only dma_copy and "
                             "tensor_copy (Beta 1: nisa.tensor_copy_dynamic_src/dst) can address it; copy it into "
                             "a tile first".format(self.name))
        acc = self._access()
        if self._dt is None:
            return acc
        if isinstance(acc, str):  # the whole tensor, with the full index spelled out
            base = self._st.base if isinstance(self._st, _ViewStorage) else self._st
            acc = {"tensor": acc, "index": [{"start": 0, "size": int(n)} for n in base.shape]}
        acc["dtype"] = self._dt
        return acc

    def _access(self):
        st = self._st.base if isinstance(self._st, _ViewStorage) else self._st
        if st.stale is not None:  # a tile of an earlier iteration of a loop recorded symbolically
            raise _NeedsConcrete("a tile of an earlier iteration is used", st.stale)
        if isinstance(self._st, _ViewStorage):
            base, off, pat = self._flat()
            try:
                idx, order = ir_index(base.shape, off, pat, base.buffer in ON_CHIP)
            except _NeedsConcrete:
                # moved by a loop index across dims of the tensor (a row tile of x.reshape((B * S, H)) crossing
                # a batch): as an index of the reshape itself, when it is one of the whole tensor
                acc = self._reshape_access(base)
                if acc is None:
                    raise
                return acc
            except _NotExpressible as e:
                redim = ir_redim(base.shape, off, pat, base.buffer in ON_CHIP)
                strided = None if redim is not None else ir_strided(base.shape, off, pat, base.buffer in ON_CHIP)
                if strided is not None:  # an overlapping read (max-pool windows): kernel.json "strides"
                    return dict({"tensor": base.name}, **strided)
                if redim is None:
                    raise make_error("BadView", "the view {} of tensor '{}' (shape {}) cannot be expressed "
                                     "as a kernel-IR access: {} (copy it into a fresh tile first)".format(
                                         tuple(self.shape), self.name, base.shape, e))
                shape, idx, order = redim  # the tensor's elements with a finer shape (kernel.json "shape")
                acc = {"tensor": base.name, "shape": list(shape), "index": idx}
                if order is not None:
                    acc["order"] = order
                return acc
            if order is not None:  # a permuted view (permute, .T, rearrange): the dims in visiting order
                return {"tensor": base.name, "index": idx, "order": order}
            if all(isinstance(e, dict) and "broadcast" not in e and not isinstance(e["start"], Sym) and
                   e["start"] == 0 and e["size"] == n and
                   e.get("step", 1) == 1 for e, n in zip(idx, base.shape)):
                return base.name
            return {"tensor": base.name, "index": idx}
        if self.is_full():
            return self._st.name
        idx = []
        for start, size, step, kept in self._dims:
            if not kept:
                idx.append(start)
            elif step == 0:  # stride-0 (broadcast) dim
                idx.append({"start": start, "broadcast": size})
            else:
                d = {"start": start, "size": size}
                if step != 1:
                    d["step"] = step
                idx.append(d)
        return {"tensor": self._st.name, "index": idx}

    def _reshape_access(self, base):
        """The access of this view of a whole-tensor row-major reshape (the view storage's own dims, kernel.json
        ``"shape"``), or None when its storage is not one."""
        vs = self._st
        n = int(np.prod(base.shape, dtype=np.int64))
        if (isinstance(vs.offset, Sym) or vs.offset != 0 or int(np.prod(vs.shape, dtype=np.int64)) != n or
                list(vs.strides) != _rowmajor(vs.shape) or
                (base.buffer in ON_CHIP and (len(vs.shape) < 2 or vs.shape[0] != base.shape[0]))):
            return None
        idx = []
        for start, size, step, kept in self._dims:
            if not kept:
                idx.append(start)
            elif step == 0:
                idx.append({"start": start, "broadcast": size})
            else:
                idx.append({"start": start, "size": size} if step == 1 else {"start": start, "size": size, "step": step})
        return {"tensor": base.name, "shape": [int(x) for x in vs.shape], "index": idx}

    def region(self):
        """Per storage dim (first, last, step) for overlap tests."""
        return tuple((d[0], d[0] + (d[1] - 1) * d[2], d[2]) for d in self._dims)


# --------------------------------------------------------------------------------------------------
# The tracer
# --------------------------------------------------------------------------------------------------

_local = threading.local()


def _stack():
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def active():
    """The innermost running tracer, or None."""
    s = getattr(_local, "stack", None)  # (_stack() inlined: this runs several times per statement traced)
    return s[-1] if s else None


def current(what="this function"):
    t = active()
    if t is None:
        raise make_error("OutsideKernel", "{} can only be called inside an NKI kernel (a function "
                         "decorated with @nki.jit and called with arrays, or run by nki.simulate)".format(what))
    return t


def emit(stmt):
    """THE seam: every IR statement (alloc, op) of the running kernel goes through here."""
    return current().emit(stmt)


def _slot_keys():
    """Every operand slot key of kernel.json ops (isa/opcodes.def, via nsim._isa), in table order."""
    return _isa.SLOT_KEYS


_SLOT_RANK = None


_OPERAND_ORDER = {}  # a statement's keys (in order) -> its operand slots among them, in table order (Tracer._operands)


def _slot_rank():
    """{operand slot key: its position in _slot_keys()} (statements have a few of the 31 slots: tracing
    looks their keys up here instead of trying every slot)."""
    global _SLOT_RANK
    if _SLOT_RANK is None:
        _SLOT_RANK = {k: i for i, k in enumerate(_isa.SLOT_KEYS)}
    return _SLOT_RANK


def device_print(prefix, tensor):
    """``nl.device_print``: ``prefix`` and the current values of ``tensor`` on stdout (flushed)."""
    vals = tensor.numpy() if isinstance(tensor, NkiTensor) else np.asarray(tensor)
    if vals.dtype.kind not in "biuf":
        vals = vals.astype(np.float32)
    print("{} {}".format(prefix, vals), flush=True)


class _Eager:
    """Eager values of one kernel being traced. The instructions traced so far are replayed through a C++
    ``_nsim.EagerSession`` (the simulator's own semantics, no timing) when a value is first asked for;
    later requests run only the instructions traced since. The kernel's inputs are its array arguments."""

    def __init__(self, tr):
        self.tr = tr
        self.session = None
        self.synced = 0  # statements of tr.body already executed
        self.allocs = {}  # tile name -> alloc dict (every tile the session knows)
        self.declared = set()  # HBM tensor names declared in the session

    def _start(self):
        core = _core
        if core is None:
            from nsim import _core as core  # noqa: F811
        self.session = core._nsim.EagerSession(self.tr.config, core._overrides(self.tr.overrides))

    def sync(self):
        tr = self.tr
        if self.session is None:
            self._start()
        ses = self.session
        for t in tr.tensors:
            nm = t["name"]
            if nm in self.declared:
                continue
            arr = tr.arguments.get(nm)
            a = arr[0] if arr is not None else tr.constants.get(nm)
            if a is not None:
                a = np.asarray(_to_numpy(a))
                a = a.reshape(t["shape"]) if a.ndim == 0 else a
                if a.dtype != np_dtype(t["dtype"]):
                    a = a.astype(np_dtype(t["dtype"]))
            ses.add_input(nm, t["dtype"], [int(x) for x in t["shape"]], a)
            self.declared.add(nm)
        new = tr.body[self.synced:]
        if not new:
            return
        ops = []

        def take(stmts, out):  # allocs (also those of loop bodies: values only) declared up front
            for st in stmts:
                if "alloc" in st:
                    a = st["alloc"]
                    self.allocs[a["name"]] = a
                elif "op" in st:
                    out.append(st)
                elif "loop" in st:
                    lp = dict(st["loop"])
                    lp["body"] = take(lp.get("body", []), [])
                    out.append({"loop": lp})
            return out

        take(new, ops)
        frag = {"nsim_kernel": 1, "name": tr.name + "__eager",
                "tensors": [dict(t, kind="input") for t in tr.tensors],
                "body": [{"alloc": a} for a in self.allocs.values()] + ops}
        if tr._alias:
            frag["body"] = _renamed(frag["body"], tr.resolve_alias)
        if tr.stacks:
            frag["stacks"] = list(tr.stacks)
        ses.run(json.dumps(frag))
        self.synced += len(new)

    def values(self, t):
        """numpy array of the current values of view ``t``."""
        if getattr(t, "_adv", None) is not None:
            raise make_error("ValuesUnavailable", "the values of an nl.arange-indexed view of '{}' are not "
                             "available: look at the whole tensor, or copy the view into a tile first".format(t.name))
        if t._ind is not None:  # its elements move with a runtime value: the static window would mislead
            raise make_error("ValuesUnavailable", "the values of the runtime-indexed view of '{}' are not available: "
                             "copy it into a tile first (tensor_copy / dma_copy)".format(t.name))
        if t._oob is not None:  # .ap(scalar_offset=reg) out of range: its static window is not what it addresses
            raise make_error("IndexOutOfBounds", t._oob)
        concrete_only("a value read")
        base, off, pat = t._flat() if not getattr(t, "_t2d", False) else t._storage_order()._flat()
        tr = self.tr
        if base.name in tr.peer_data:
            raise make_error("NotSupported", "the values of '{}' come from the other core ('{}' is the {} of a "
                             "cross-core exchange on core {} of this LNC={} launch): nsim traces the cores one after "
                             "another, so the other core's writes are not there while this one is traced "
                             "(docs/lnc.md, Limits). Values read while tracing (register_load, .item(), print, an "
                             "if on a value) must come from this core's own data".format(
                                 t.name, base.name, tr.peer_data[base.name], tr.lnc[0], tr.lnc[1]))
        self.sync()
        dt = np_dtype(base.dtype)
        raw = self.session.read(base.name)
        flat = np.frombuffer(raw, dtype=dt)
        shape = [c for _, c in pat]
        strides = [s * dt.itemsize for s, _ in pat]
        out = np.lib.stride_tricks.as_strided(flat[off:], shape=shape, strides=strides).copy()
        out = out.reshape(tuple(t._storage_order().shape if getattr(t, "_t2d", False) else t.shape))
        if getattr(t, "_dt", None):  # a reinterpreting view: the same bytes as its dtype
            out = out.view(np_dtype(t._dt))
        return out.T.copy() if getattr(t, "_t2d", False) else out


_AFFINE_MAX_WRITES = 4096  # writes remembered per (affine loop, tensor): bounds the check's cost

_CHECK_TABLE = None


def check_info(check):
    """{code, check, fix} of a sanitizer check (the table is engines/check/checker.h, via _nsim)."""
    global _CHECK_TABLE
    if _CHECK_TABLE is None:
        core = _core
        if core is None:
            from nsim import _core as core  # noqa: F811
        _CHECK_TABLE = {c["check"]: dict(c) for c in core._nsim.check_table()}
    return _CHECK_TABLE[check]


def _access_key(v):
    """A hashable form of an IR access (index expressions by their terms: the same key is the same elements in
    every iteration)."""
    def k(x):
        ty = type(x)
        if ty is int or ty is str:  # (the common leaves first: by type, as the checks below would answer)
            return x
        if ty is list:
            return tuple(map(k, x))
        if isinstance(x, Sym):
            c, t = x._open()
            return ("S", c, tuple((id(var), co) for var, co in t)) if t else c
        if isinstance(x, dict):
            return tuple(sorted((key, k(val)) for key, val in x.items()))
        if isinstance(x, (list, tuple)):
            return tuple(k(e) for e in x)
        return x
    return v if isinstance(v, str) else k(v)


def _outer_terms(terms, var, into, scale=1):
    """Add to ``into`` ({id(LoopVar): coefficient}) the terms of loops enclosing ``var``'s (and of launch grids), each
    coefficient times ``scale``: what two iterations of ``var``'s loop have alike (their indices do not move while it
    runs). Zero coefficients are dropped, so two sums compare equal as dicts."""
    for x, co in terms:
        if x is not var and x.depth < var.depth:
            c = into.get(id(x), 0) + co * scale
            if c:
                into[id(x)] = c
            else:
                into.pop(id(x), None)
    return into


def _inplace_accumulation(stmt):
    """``dst = dst <op> x``: a tensor_tensor whose dst is the same access as its data1, with a reduction operator
    of the ALU table (add, subtract, multiply, maximum, ...), as ``t[...] += x`` writes it. Such updates give the
    same result in any order of an affine_range's iterations: the spec's associative accumulation, allowed."""
    alu = _isa.ALU.get(stmt.get("alu0"))
    return (stmt.get("op") == "tensor_tensor" and alu is not None and alu["reduce"] and
            stmt.get("dst") is not None and stmt.get("dst") == stmt.get("data1"))


class _Region(tuple):
    """(start, count, step) per dim of an IR access, with ``layout`` = (shape, element strides, bytes per element)
    of the dims it indexes: the tensor's own, or those of a re-dimensioned access (``"shape"``/``"strides"``) or
    of a view of another element size (``"dtype"``: the tensor's last dim scaled)."""
    layout = None


def _access_units(v, tracer):
    """(shape, bytes per element) an IR access indexes before any ``"shape"``: the tensor's, or through a
    ``"dtype"`` of another element size the tensor's bytes as its elements (as kernel.json reads it)."""
    name = v if isinstance(v, str) else v["tensor"]
    shape, tb = tuple(tracer.shapes.get(name, ())), tracer.itemsizes.get(name, 1)
    if isinstance(v, dict) and "dtype" in v:
        vb = np_dtype(v["dtype"]).itemsize
        if vb != tb and shape:
            return shape[:-1] + (int(shape[-1]) * tb // vb,), vb
    return shape, tb


def _exact_region(v, tracer):
    """Per dim of the tensor (start, count, step) of an IR access (a name: the whole tensor)."""
    base, unit = _access_units(v, tracer)
    if isinstance(v, str):
        shape = base
        out = [(0, n, 1) for n in shape]
    else:
        shape = tuple(v.get("shape") or base)
        out = []
        for e in v.get("index", []):
            if isinstance(e, (int, Sym)):
                out.append((e, 1, 1))
            elif "broadcast" in e:
                out.append((e.get("start", 0), 1, 1))
            else:
                out.append((e.get("start", 0), e.get("size", 1), e.get("step", 1)))
    reg = _Region(out)
    strides = v.get("strides") if isinstance(v, dict) else None
    if not strides:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= int(n)
        strides.reverse()
    reg.layout = (tuple(int(n) for n in shape), tuple(int(s) for s in strides), unit)
    return reg


def _flat_overlap(a, b):
    """Whether two regions of one tensor with different layouts (one access re-dimensioned by a reshape: rows
    of a ``(B*S, H)`` view of a ``(B, S, H)`` tensor) share an element, compared on the tensor's flat elements.
    Symbolic starts (a loop being recorded) are compared through the difference of the two regions' first
    elements, when it is the same in every iteration; True when that cannot be decided cheaply (a difference
    that depends on the index, huge regions)."""
    bases, rels = [], []
    units = {reg.layout[2] for reg in (a, b)}
    for reg in (a, b):
        shape, strides, unit = reg.layout
        dims = list(reg) + [(0, n, 1) for n in shape[len(reg):]]
        if len(dims) != len(strides) or any(not isinstance(s, (int, np.integer, Sym)) for s, _n, _k in dims):
            return True
        if int(np.prod([n for _s, n, _k in dims], dtype=np.int64)) > 1 << 22:
            return True
        base, rel = 0, np.zeros((), np.int64)
        for (s, n, k), st in zip(dims, strides):
            base = base + (s if isinstance(s, Sym) else int(s)) * int(st)
            rel = np.add.outer(rel, int(k) * np.arange(int(n), dtype=np.int64) * int(st))
        rel = rel.ravel()
        if len(units) > 1:  # views of different element sizes (t.view(dtype)): compared byte by byte
            base, rel = base * unit, np.add.outer(rel * unit, np.arange(unit, dtype=np.int64)).ravel()
        bases.append(base)
        rels.append(rel)
    d = bases[0] - bases[1]
    d = d.resolved() if isinstance(d, Sym) else d
    if isinstance(d, Sym):
        return True
    fa, fb = rels[0] + int(d), rels[1]
    if fa.size == 0 or fb.size == 0 or fa.max() < fb.min() or fb.max() < fa.min():
        return False
    return bool(np.isin(fa, fb).any())


def _dims_overlap(a, b):
    (s0, n0, k0), (s1, n1, k1) = a, b
    if s0 + (n0 - 1) * k0 < s1 or s1 + (n1 - 1) * k1 < s0:
        return False
    if k0 == k1:
        return (s0 - s1) % k0 == 0
    if n0 * n1 <= 1 << 16:
        return bool(set(range(s0, s0 + n0 * k0, k0)) & set(range(s1, s1 + n1 * k1, k1)))
    return True


def _regions_overlap(a, b):
    la, lb = getattr(a, "layout", None), getattr(b, "layout", None)
    if la is not None and lb is not None and la != lb:
        return _flat_overlap(a, b)
    if len(a) != len(b):
        return True
    return all(_dims_overlap(x, y) for x, y in zip(a, b))


def concrete_only(what):
    """``what`` needs concrete values (a value read, a register): inside a loop being recorded symbolically
    that loop is unrolled instead."""
    tr = active()
    if tr is not None and tr._recs:
        raise _NeedsConcrete("{} in the loop body".format(what))


class _CanonNames(dict):
    """Tracer._canon's renaming: {name: its canonical name}, each name worked out once on first use (a body names
    the same few tensors in statement after statement; looked up through the dict's __getitem__, no Python call
    per name then)."""

    __slots__ = ("local", "res", "outside")

    def __init__(self, local, res, outside):
        super().__init__(local)
        self.local, self.res, self.outside = local, res, outside

    def __missing__(self, n):
        r = self.res(n)
        v = self[n] = self.local.get(r) or ("#o" if n in self.outside else r)
        return v


def _same_renamed(a, fa, b, fb):
    """``_renamed(a, fa) == _renamed(b, fb)``, compared statement by statement without making the copies (a loop's
    passes are compared so, _record_piece)."""
    if len(a) != len(b):
        return False
    slots = _slot_rank()
    for x, y in zip(a, b):
        if "op" in x:
            if "op" not in y or len(x) != len(y):
                return False
            for k, v in x.items():
                if k not in y:
                    return False
                w = y[k]
                if k not in slots:
                    if v != w:
                        return False
                elif v is None or w is None:
                    if v is not w:
                        return False
                elif isinstance(v, str) or isinstance(w, str):
                    if not (isinstance(v, str) and isinstance(w, str) and fa(v) == fb(w)):
                        return False
                elif not _same_but(v, w, "tensor", fa, fb):
                    return False
        elif "alloc" in x:
            if "op" in y or "alloc" not in y or not _same_but(x["alloc"], y["alloc"], "name", fa, fb):
                return False
        elif "loop" in x:
            if "op" in y or "alloc" in y or "loop" not in y:
                return False
            lx, ly = x["loop"], y["loop"]
            if lx.keys() | {"body"} != ly.keys() | {"body"} or any(lx[k] != ly[k] for k in lx if k != "body"):
                return False
            if not _same_renamed(lx.get("body", []), fa, ly.get("body", []), fb):
                return False
        elif x != y:
            return False
    return True


def _same_but(v, w, key, fa, fb):
    """``dict(v, key=fa(v[key])) == dict(w, key=fb(w[key]))`` (the rest compared by the dicts' own ==)."""
    a, b = v[key], w[key]
    if fa(a) != fb(b):
        return False
    return v == w if a == b else {**v, key: None} == {**w, key: None}


def _renamed(stmts, fn):
    """A copy of ``stmts`` with every tensor name n of an operand or alloc replaced by fn(n)."""
    slots = _slot_rank()
    out = []
    for st in stmts:
        if "op" in st:
            new = dict(st)
            for k, v in st.items():
                if v is None or k not in slots:
                    continue
                if isinstance(v, str):
                    new[k] = fn(v)
                else:
                    new[k] = dict(v, tensor=fn(v["tensor"]))
            st = new
        elif "alloc" in st:
            st = {"alloc": dict(st["alloc"], name=fn(st["alloc"]["name"]))}
        elif "loop" in st:
            st = {"loop": dict(st["loop"], body=_renamed(st["loop"].get("body", []), fn))}
        out.append(st)
    return out


_EXPR_TERM = re.compile(r"([+-]?)(?:(\d+)\*)?([A-Za-z_]\w*)$|([+-]?)(\d+)$")


@functools.lru_cache(maxsize=1 << 16)
def _substituted(e, var, value):
    """The index expression ``e`` (a Sym.expr() string) with the loop variable ``var`` replaced by ``value``: an int
    when no variable is left, else the expression of the rest (cached: a written-out loop repeats the same few
    expressions, value by value)."""
    values = {var: value}
    c, terms = 0, []
    for tok in re.findall(r"[+-]?[^+-]+", e.replace(" ", "")):
        m = _EXPR_TERM.match(tok)
        if m is None:  # (not an expression Sym.expr() writes)
            raise ValueError("cannot substitute into the index expression {!r}".format(e))
        if m.group(5) is not None:
            c += int(m.group(5)) * (-1 if m.group(4) == "-" else 1)
            continue
        k = int(m.group(2) or 1) * (-1 if m.group(1) == "-" else 1)
        if m.group(3) in values:
            c += k * values[m.group(3)]
        else:
            terms.append((m.group(3), k))
    if not terms:
        return c
    parts = []
    for v, k in terms:
        term = v if abs(k) == 1 else "{}*{}".format(abs(k), v)
        parts.append(("- " if k < 0 else "+ ") + term if parts else ("-" if k < 0 else "") + term)
    if c:
        parts.append("{} {}".format("-" if c < 0 else "+", abs(c)))
    return " ".join(parts)


def _iimm_uses(stmts, var):
    """True when an iota or affine_select of ``stmts`` (nested loops included) has a pattern entry (iimm) whose
    expression uses ``var``. (A matmul's PE tile moving with the index keeps its loop a loop.)"""
    pat = None
    for st in stmts:
        if "loop" in st:
            if _iimm_uses(st["loop"].get("body", []), var):
                return True
            continue
        if st.get("op") not in ("iota", "affine_select"):
            continue
        for e in st.get("iimm") or ():
            if isinstance(e, str):
                pat = pat or re.compile(r"\b{}\b".format(re.escape(var)))
                if pat.search(e):
                    return True
    return False


def _expand_into(stmts, var, value, ren, slots, out):
    """Copies of ``stmts`` into ``out`` with the loop variable ``var`` taking ``value`` and the tiles of ``ren``
    renamed."""
    sub = _substituted
    for st in stmts:
        if "alloc" in st:
            a = st["alloc"]
            out.append({"alloc": dict(a, name=ren.get(a["name"], a["name"]))})
        elif "loop" in st:
            lp = dict(st["loop"])
            lp["body"] = []
            _expand_into(st["loop"].get("body", []), var, value, ren, slots, lp["body"])
            out.append({"loop": lp})
        else:
            new = dict(st)
            for k, v in st.items():
                if k in slots and v is not None:
                    if isinstance(v, str):
                        new[k] = ren.get(v, v)
                    else:
                        d = dict(v, tensor=ren.get(v["tensor"], v["tensor"]))
                        idx = v.get("index")
                        if idx:
                            d["index"] = [(sub(e, var, value) if type(e) is str else e) if type(e) is not dict else
                                          dict(e, start=sub(e["start"], var, value)) if type(e.get("start")) is str
                                          else e for e in idx]
                        new[k] = d
                elif k == "iimm":
                    new[k] = [sub(e, var, value) if type(e) is str else e for e in v]
            out.append(new)


def _alloc_names(stmts, out=None):
    """Names of the tiles allocated in ``stmts`` (loop bodies too), in program order."""
    out = [] if out is None else out
    for st in stmts:
        if "alloc" in st:
            out.append(st["alloc"]["name"])
        elif "loop" in st:
            _alloc_names(st["loop"].get("body", []), out)
    return out


def _allocates_tiles(body):
    """True when statements ``body`` (nested loops included) allocate a tile."""
    for st in body:
        if "alloc" in st:
            return True
        if "loop" in st and _allocates_tiles(st["loop"].get("body", [])):
            return True
    return False


def _expand_passes(n, dropped, g):
    """Passes a piece of ``n`` iterations written out needs (Tracer._expand_piece): iteration k < n - 1 takes pass
    (k - dropped) mod g (the pool's storages rotate with period g; ``dropped`` narrowed passes ran first), the last
    iteration the last pass, which must have its phase: the least such index not below the others'. (A short piece
    takes fewer than g passes: with g = 4 the flash attention sample's traced twice as many passes as with 2.)"""
    need = max(((k - dropped) % g for k in range(min(n - 1, g))), default=-1)
    m = (n - 1 - dropped) % g
    while m < need:
        m += g
    return m + 1


#: A kept loop whose body takes a line's tiles unevenly (Tracer._uneven_rotation) is peeled and grouped only while
#: its recorded body has at most this many statements (inner loops' bodies counted once): its iterations' one
#: stall each is then a visible part of them, and writing out or grouping the loop stays cheap. The public
#: nki-samples flash_fwd's GQA loop (799 statements at seq 2048, 48,759 at 16384; 2 iterations) is left kept:
#: written out it doubled the trace at 16384 (6.6 -> 14.1 s) for 0.8 % of simulated time. attention_naive's head
#: loop, 459 statements, is grouped.
UNEVEN_MAX_BODY = 500


def _count_stmts(body):
    """Statements of ``body``, those of its loops' bodies (once each) included."""
    n = 0
    for st in body:
        n += 1
        if "loop" in st:
            n += _count_stmts(st["loop"].get("body", []))
    return n


def _body_rec_index(recs):
    """Index in ``recs`` of the innermost loop being recorded that is not a pair loop (-1: none)."""
    j = len(recs) - 1
    while j >= 0 and (recs[j].pairs or recs[j].pool):
        j -= 1
    return j


def _body_rec(recs):
    """The innermost loop being recorded that is not a pair loop (its body holds their tiles' allocs), or
    None."""
    j = _body_rec_index(recs)
    return recs[j] if j >= 0 else None


_FOR_RE = re.compile(r"^\s*(?:async\s+)?for\s+([A-Za-z_]\w*)\s+in\b")


#: The third part of the key of a launch grid's loop (file, line of the kernel's def, GRID_LOOP, dim): a Beta-1
#: kernel's grid instances are traced as loops over their program ids where their statements do not depend on
#: them (nki/beta1/__init__.py, Kernel._launch_fn).
GRID_LOOP = "grid"


class _Rec:
    """One loop being recorded symbolically."""

    __slots__ = ("key", "var", "kind", "checking", "storages", "names", "local", "written", "read", "site_allocs",
                 "pairs", "outer_body", "pool", "wregs", "takes")

    def __init__(self, key, var, kind, pairs=False, outer_body=None):
        self.key, self.var, self.kind, self.checking, self.storages = key, var, kind, False, []
        # a group of iterations per pass, their tiles taken from the enclosing body's (Tracer._record_loop)
        self.pairs, self.outer_body = pairs, outer_body
        self.names = set()  # tiles allocated by the current pass itself (only these may be reused in it)
        self.local = set()  # tiles allocated in the current pass, in loops inside it too
        self.site_allocs = {}  # pool key -> alloc statements of the current pass's new storages for it
        self.takes = {}  # pool key -> tiles of that line (unnamed, unplaced) the current pass took, reused ones too
        # recorded to be written out iteration by iteration (Tracer._record_piece): its tiles taken as a pair loop's
        self.pool = False
        self.written, self.read = set(), set()  # the sanitizer's check: tensors not made in the body
        self.wregs = {}  # ... and per written tensor, the accesses that wrote it ({_access_key: _exact_region})


class AffineRange:
    """``nl.affine_range(...)``: a range whose iterations the kernel promises are independent. Iterating
    it (inside a kernel) records the body once with a symbolic index when it can (Tracer.symbolic_loop),
    else runs every iteration; with the sanitizer on it tells the tracer which iteration runs, for the
    check of two iterations writing the same bytes."""

    __slots__ = ("_r",)
    kind = "affine"

    def __init__(self, r):
        self._r = r

    def __len__(self):
        return len(self._r)

    def __getitem__(self, i):
        return self._r[i]

    def __contains__(self, x):
        return x in self._r

    def __reversed__(self):
        return reversed(self._r)

    def __repr__(self):
        return "affine_range({}, {}, {})".format(self._r.start, self._r.stop, self._r.step)

    def __iter__(self):
        tr = active()
        if tr is not None and len(self._r) >= 2:
            sym = tr.symbolic_loop(self._r, self.kind)
            if sym is not None:
                return sym
        return self._iter_unrolled(tr)

    def _iter_unrolled(self, tr):
        if tr is None or not tr.check or len(self._r) < 2:
            yield from self._r
            return
        f = _AffineFrame(user_loc(), len(tr._recs))
        tr._affine.append(f)
        try:
            for k, i in enumerate(self._r):
                f.iteration = k
                f.stamp = next(tr._stamps)
                yield i
        finally:
            if f in tr._affine:
                tr._affine.remove(f)


class SequentialRange(AffineRange):
    """``nl.sequential_range(...)``: iterations in order (a loop-carried dependency is allowed). Like
    affine_range, its body is recorded once with a symbolic index when it can."""

    __slots__ = ()
    kind = "sequential"

    def __repr__(self):
        return "sequential_range({}, {}, {})".format(self._r.start, self._r.stop, self._r.step)

    def _iter_unrolled(self, tr):
        return iter(self._r)


class _AffineFrame:
    __slots__ = ("loc", "iteration", "stamp", "writes", "reported", "nrecs")

    def __init__(self, loc, nrecs=0):
        self.loc, self.iteration, self.stamp, self.writes, self.reported = loc, 0, 0, {}, False
        self.nrecs = nrecs  # loops being recorded symbolically around it (their indices are fixed in it)


class Tracer:
    def __init__(self, name="kernel", tensor_cls=None):
        self.name = name
        self.tensor_cls = tensor_cls or NkiTensor  # the view class of this dialect (Beta 1: a subclass)
        self.dialect_state = {}  # free space for a dialect frontend (Beta-1 launch grid, ...)
        self.tensors = []  # kernel-level HBM tensor dicts
        self.body = []
        self.stacks = []  # interned call stacks (kernel.json "stacks"); ops' loc["stack"] indexes it
        self._stack_ids = {}
        # (code, line, stack id) -> the loc dict of the ops there: one dict per line and call stack, shared
        # by its ops (a kernel with its loops unrolled has a loc per op; ~200 bytes each).
        self._locs = {}
        self._op_locs = {}  # the user frame's and its callers' (id(code), offset) -> (_op_loc's location, the code)
        self.names = set()
        self.storage = {}  # name -> _Storage (strong, for HBM) / meta
        self.buffers = {}  # name -> buffer
        self.shapes = {}  # name -> shape
        self.itemsizes = {}  # name -> bytes per element
        self.counter = itertools.count()
        self.open_groups = {}  # psum tensor name -> set of regions with an open accumulation group
        self.unwritten_psum = set()  # PSUM tiles nothing wrote since their allocation (Beta-1 `+=` starts a group)
        self._pending_fill = {}  # tile name -> (body list, memset, zero?): a whole-tile fill nothing accessed since
        self.written = set()
        self.read = set()
        self.pool = {}  # (buffer, dtype, shape, file, line) -> list of weakrefs of dead-able tile storages
        self._site_last = {}  # the same key -> the storages its latest tiles took, oldest first (not handed out next)
        self._latest = None  # (key, its _site_last entry before) of the latest tile (_took)
        self._nbufs = None  # compiler.loop_buffers and psum_loop_buffers of the run's config (_recent_kept)
        self._last_alloc = None  # the alloc statement _alloc_storage emitted last
        self._pool_free = {}  # the same key -> list of names whose python objects died
        self.reuse_tiles = True
        # scheduling directives (spec compiler.md §1): the op label of the running nisa call (name=), the
        # order group of the open `no_reorder` block (0: none) and the kernel's with_schedule edges
        self.label = None
        # labels every op emitted now waits for (a runtime loop's bound / exit registers: runtime_loop) and the
        # counter naming register_load instructions
        self.reg_after = ()
        self._reg_loads = itertools.count(1)
        self.order_group = 0
        self._reorder_depth = 0
        self._order_groups = itertools.count(1)
        self.schedule = None
        self.constants = {}  # IR name -> numpy array (nl.shared_constant): extra inputs of the kernel
        self.arguments = {}  # IR name -> (caller array, tensor): the kernel's array arguments (eager inputs)
        self.config, self.overrides = "trn2", []  # where eager values are computed (the run's config)
        self._eager = None  # _Eager: created when a value is first asked for
        # the sanitizer's affine_range check (AffineRange): the open affine loops, innermost last, and per
        # tile the iteration stamps of the loops open when it was made (a tile made inside an iteration
        # is that iteration's own)
        self._affine = []
        self._birth = {}
        self._stamps = itertools.count(1)
        self.shared_hbm = set()  # names of the shared_hbm tensors the kernel made (its outputs, when returned)
        self.check_reports = []  # reports found while tracing (dicts, as Profile.check_reports)
        # (file, line) of the compute ops a non-rectangular mask split into boxes at start partitions the hardware's
        # rule does not allow (beta1 language._note_split_starts): the sanitizer's NSIM-W509 there is not reported
        self.split_sites = set()
        self.check = False  # run the tracer's checks (options(check=...))
        self._vars = {}  # tile name -> the variables its storage was assigned to (reuse: several)
        self.lnc = (0, 1)  # (this program's physical core, LNC degree): kernel[2] traces once per core
        # tensors that hold the other core's data (a sendrecv's dst, a core_barrier's data): their values are not
        # known while this core is traced (the cores are traced one after another; _Eager.values refuses them)
        self.peer_data = {}  # storage name -> what it is ("dst of a sendrecv", "data of a core_barrier")
        # loops kept symbolic (symbolic_loop): the loops being recorded (innermost last), the loops to unroll
        # (source (file, line) keys; set by trace() after a failed symbolic recording), a loop left by break /
        # return / an exception while being recorded, tile names of the checking pass -> the recorded names
        self._recs = []
        self.unroll = set()
        self.peel = set()  # loops whose first and last iterations run unrolled, the others symbolically
        self.pair = set()  # peeled loops whose other iterations are recorded two per pass (_record_loop)
        self.expand = set()  # loops recorded and written out iteration by iteration (_record_piece)
        self.unroll_all = True  # trace() sets it from the loops mode
        self._broken = None
        self._alias = {}
        self._loop_names = set()  # tiles allocated in loop bodies (never reused outside their pass)
        self._symbolic = False  # a loop was recorded symbolically (statements may hold Sym values)
        self._nstmts = 0
        self.progress = _progress_hook  # progress(statements) every PROGRESS_STATEMENTS statements, or None

    # ---- loops kept as loops ----------------------------------------------------------------------
    def resolve_alias(self, name):
        a = self._alias
        while name in a:
            name = a[name]
        return name

    def symbolic_loop(self, r, kind, key=None, loc=None, name=None):
        """A generator recording the body of a loop over ``r`` with a symbolic index, or None when the loop
        is to be unrolled (forced, with the sanitizer on, or after a failed attempt: trace() traces the
        kernel again with the loop's source line in ``self.unroll``).

        The body runs twice with the same symbolic index (one pass when an enclosing loop is in its second
        pass): the first pass is the loop's body in the IR; the second checks that the body does not depend
        on Python state carried from one iteration to the next (a flag, a previous tile): both must give the
        same statements, up to the names of the tiles they allocate, else the loop is unrolled. Tiles of the
        first pass are stale from then on (using one later is an iteration using an earlier iteration's tile:
        unrolled); tiles of the second pass are the last iteration's (their names are aliases of the first
        pass's). Anything needing the index as an int, a value read (eager), a register, an HBM tensor
        made in the body, an nc_matmul(accumulate=None) on a tile not made in the body, break / return out
        of the body, or an error in it: the loop is unrolled."""
        if self.unroll_all:
            return None
        f = None
        if key is None:  # a loop of the kernel: its `for` line
            f = user_frame()
            key = (f.f_code.co_filename, _lineno(f)) if f is not None else None
        if key is None or key in self.unroll or self._broken is not None:
            return None
        if key in self.peel and key not in self.expand:
            return self._peeled_loop(r, kind, key, f, loc, name)
        return self._record_loop(r, kind, key, f, loc=loc, name=name)

    def _peeled_loop(self, r, kind, key, f, loc=None, name=None):
        """The first and the last iteration run with their int index, the ones between are recorded as a
        loop (a body that differs only in its first / last iteration: ``if c == 0``, ``accumulate=j > 0``).
        With the sanitizer on, the iterations of an affine_range that run with their int index are checked
        against each other as an unrolled loop's are (_affine_writes; the recorded ones by _affine_symbolic)."""
        frame = _AffineFrame(user_loc(), len(self._recs)) if kind == "affine" and self.check else None
        try:
            yield from self._peeled_iterations(r, kind, key, f, loc, name, frame)
        finally:
            if frame in self._affine:
                self._affine.remove(frame)

    def _concrete(self, frame, r, i):
        """Iteration ``i`` of the loop over ``r`` run with its int index, under ``frame`` (the peeled loop's
        _AffineFrame, or None) only while it runs: the iterations recorded as a loop are not its."""
        if frame is None:
            yield i
            return
        frame.iteration, frame.stamp = r.index(i), next(self._stamps)
        self._affine.append(frame)
        try:
            yield i
        finally:
            if frame in self._affine:
                self._affine.remove(frame)

    def _peeled_iterations(self, r, kind, key, f, loc, name, frame):
        yield from self._concrete(frame, r, r[0])
        mid = r[1:-1]
        if key in self.pair:
            g = self._group()
            for i in mid[:len(mid) % g]:
                yield from self._concrete(frame, r, i)
            mid = mid[len(mid) % g:]
            if len(mid) >= 2 * g:
                yield from self._record_loop(mid, kind, key, f, pairs=True, loc=loc, name=name)
            else:
                for i in mid:
                    yield from self._concrete(frame, r, i)
        elif len(mid) >= 2:
            before = len(self.body)
            yield from self._record_loop(mid, kind, key, f, loc=loc, name=name)
            if any("loop" in st and (st["loop"].get("loc") or {}).get("line") == key[1] and
                   _allocates_tiles(st["loop"].get("body", [])) for st in self.body[before:]):
                # Peeled, a line's tiles would be three allocations (first iteration, the loop, the last), each
                # with its own rotating buffers, where the unrolled loop rotates one over its storages: PSUM's 8
                # banks run out, and SBUF tiles get deeper buffers than the compiler gives (a kept trace up to
                # 11 % faster than the unrolled one). Recorded a group of iterations per pass instead (_group),
                # over the line's storages (_record_loop): the unrolled trace's storages and time.
                raise _NeedsConcrete("a peeled loop's body allocates tiles (peeled, each would take two more "
                                     "buffers)", key, pair=True)
        else:
            for i in mid:
                yield from self._concrete(frame, r, i)
        yield from self._concrete(frame, r, r[-1])

    def _record_loop(self, r, kind, key, f, pairs=False, loc=None, name=None):
        """Record the loop over ``r`` (see symbolic_loop). ``pairs``: each pass runs a group of g iterations
        (_group: 4 with trn2's rotating buffers), with the indices g*step*k + start + j*step, j = 0 .. g - 1, of a
        loop over k in range(len(r) // g) (``r``'s length a multiple of g), and the body's tiles are allocated as
        in the enclosing body, before the loop: a line's tiles rotate over the storages its tiles outside the loop
        use (compiler.loop_buffers per SBUF line, psum_loop_buffers per PSUM line), as in the unrolled trace. A
        peeled loop allocating tiles is recorded so (_peeled_loop). ``loc`` and ``name``: the
        loop's location and variable name when it is not a `for` of the kernel (a launch grid's).

        Where a comparison of the index (a Python ``if`` on it, ``mask=i >= j``) would differ between
        iterations, the loop is recorded in pieces: the comparison narrows the range being recorded to the
        iterations on which its outcome is that of the first (_narrow), the pass is run again over that range,
        and the rest of the range is recorded the same way after it; a piece of one iteration runs with its int
        index, as unrolled. Past MAX_PIECES pieces, or after two such pieces of one iteration in a row, the
        remaining iterations run unrolled."""
        if loc is None:
            loc = ({"file": f.f_code.co_filename, "line": _lineno(f), "function": f.f_code.co_name}
                   if user_loc is _default_user_loc else user_loc())  # (export_from_library.py substitutes user_loc)
        if name is None:
            m = _FOR_RE.match(linecache.getline(key[0], key[1]) or "")
            base = m.group(1) if m and m.group(1) != "_" else "i"
        else:
            base = name
        if pairs:
            yield from self._record_piece(r, kind, key, loc, base, True, frame=f)
            return
        expand = key in self.expand
        pos, pieces, singles = 0, 0, 0
        while pos < len(r):
            pieces += 1
            if pieces > MAX_PIECES or singles >= MAX_SINGLE_PIECES:
                # Past MAX_PIECES, or after two pieces of one iteration in a row (each cost a pass over the rest of
                # the range before its own: the loop's comparisons change at every index), the rest runs unrolled.
                yield from r[pos:]
                return
            n = yield from self._record_piece(r[pos:], kind, key, loc, base, False, pos > 0, expand, frame=f)
            singles = singles + 1 if n == 1 and not expand else 0
            pos += n

    def _record_piece(self, r, kind, key, loc, base, pairs, split_from=False, expand=False, frame=None):
        """Record the first iterations of the loop over ``r`` (as many as its comparisons allow, see _record_loop);
        the number of iterations recorded. ``split_from``: pieces of the loop came before. ``expand``: written out
        iteration by iteration (_expand_piece), its tiles taken from the enclosing body's pool as a pair loop's.
        ``frame``: the kernel frame running the loop, whose plain Python values (_plain_locals) must come out of
        both passes the same: a body that changes one (``count += 1``, ``offsets.append(k)``) would leave it as
        after two iterations, not all of them -- the loop is unrolled."""
        if len(r) == 1 and not pairs:
            yield r[0]
            return 1
        taken = {x.var.name for x in self._recs}
        name, n = base, 1
        while name in taken:
            name, n = "{}{}".format(base, n), n + 1
        saved = self.body
        whole = len(r)
        if pairs:  # the loop variable counts groups of g iterations
            g = self._group()
            firsts, coef = tuple(r.start + j * r.step for j in range(g)), g * r.step
            r = range(len(r) // g)
        else:  # the loop variable takes r's values
            firsts, coef = (0,), 1
        # Its range may be narrowed (recorded in pieces) once the loop is peeled, where the unrolled trace was the
        # other way, or written out (expand): a loop that peeling keeps stays as it was.
        var = LoopVar(name, r, key, len(self._recs), split=not pairs and (key in self.peel or expand))
        rec = _Rec(key, var, kind, pairs, saved)
        rec.pool = expand
        # (written out, the g passes' bodies take turns: all are run, whatever the enclosing loop's pass)
        passes = self._group() if expand else 2 if not any(x.checking for x in self._recs) else 1
        bodies, outside, every = [], [], []
        single = False
        dropped = 0  # passes run again over a narrower range
        self._symbolic = True
        self._recs.append(rec)
        try:
            while len(bodies) < passes:
                rec.checking = len(bodies) >= 1
                rec.storages = []
                rec.names, rec.local, rec.site_allocs, rec.takes = set(), set(), {}, {}
                self.body = []
                site_snap = dict(self._site_last) if expand else None
                hi = var.hi
                for c in firsts:
                    yield Sym(c, ((var, coef),))
                if frame is not None and passes == 2 and not expand:
                    snap = _plain_locals(frame)
                    if len(bodies) == 1 and snap != snap1:
                        changed = sorted(k for k in set(snap) | set(snap1) if snap.get(k) != snap1.get(k))
                        raise _NeedsConcrete("the loop body changes Python state ({}): unrolled".format(
                            ", ".join(changed[:3])), key)
                    snap1 = snap
                every.append(rec.storages)
                outer = self._recs[-2] if len(self._recs) > 1 else None
                if outer is not None:
                    outer.storages.extend(rec.storages)
                    outer.local.update(rec.local)
                narrowed = var.hi != hi  # a comparison narrowed the range: the pass is run again over it
                if narrowed and rec.checking:
                    raise _NeedsConcrete("the loop body differs between iterations", key, peel=True)
                if narrowed and expand and var.hi == var.lo:  # one iteration: this pass's body is it, as unrolled
                    bodies.append(self.body)
                    break
                if narrowed and expand:
                    # A pass run again over a narrower range: its tiles are no iteration's, so the pool's rotation
                    # goes back to where it was before it (with 4 storages per line, counting it as a dropped pass
                    # took up to 3 more passes to come round to the first iteration's storages)
                    self._site_last = site_snap
                else:
                    dropped += narrowed
                if not narrowed:
                    if not expand and not pairs and (
                            ((split_from or var.hi != max(r[0], r[-1])) and _allocates_tiles(self.body))  # (r may descend)
                            or _iimm_uses(self.body, name)):
                        # Written out iteration by iteration where the unrolled trace is the model and a loop would
                        # change the kernel's timing: a piece of a loop split by its comparisons whose body
                        # allocates tiles (as a loop of its own, each piece's tiles take rotating buffers of their
                        # own, never sharing storage within the body: PSUM ran short and the flash attention sample
                        # ran 5-28 % longer than unrolled), and a body whose iota / affine_select pattern moves with
                        # the index (with its mask loop kept, the sample ran 18-39 % longer). The kernel is traced
                        # again with every instance of the loop so (docs/kernel-json.md "Loops recorded in pieces").
                        raise _NeedsConcrete("its pieces allocate tiles, or its index moves an iota / affine_select "
                                             "pattern: written out", key, expand=True)
                    if not expand and not pairs and frame is not None and key not in self.peel and not bodies:
                        uneven = self._uneven_rotation(rec)
                        if uneven and _count_stmts(self.body) <= UNEVEN_MAX_BODY:
                            # Kept, the loop's iterations would all take the line's storages in the same turn, its
                            # last tile and the next iteration's first on one storage (docs/kernel-json.md "A line
                            # taken several times per iteration"): peeled, then recorded a group of iterations per
                            # pass (_peeled_iterations), the line's tiles rotate as the unrolled trace's do.
                            raise _NeedsConcrete("its body takes {} tiles of line {} per iteration, over {} rotating "
                                                 "buffers".format(*uneven), key, peel=True)
                    bodies.append(self.body)
                    outside.append(rec.local.difference(_alloc_names(self.body)))
                    if expand:  # the passes the piece's iterations take (_expand_piece)
                        passes = _expand_passes((var.hi - var.lo) // var.step + 1, dropped, self._group())
                if len(bodies) < passes and not expand:
                    self._stale(rec.storages, key)  # tiles of a pass that is not the last: an earlier iteration's
                if var.hi == var.lo:  # one iteration: run as unrolled
                    single = True
                    break
        except GeneratorExit:  # break / return / an exception left the body
            if self._broken is None:
                self._broken = key
            raise
        finally:
            self.body = saved
            if self._recs and self._recs[-1] is rec:
                self._recs.pop()
        if expand and len(bodies) == 1 and var.hi == var.lo:
            var.final = r[0]
            self.body.extend(self._expand_piece(bodies, name, r[:1], dropped))
            return 1
        if single:
            self._stale(every[-1], key)
            var.final = r[0]
            yield r[0]
            return 1
        body = bodies[0]
        if len(bodies) > 1:  # (each pass's canonical names made once: a written-out piece compares up to g passes)
            canon = [self._canon(b, o) for b, o in zip(bodies, outside)]
            if not all(_same_renamed(bodies[j - 1], canon[j - 1], bodies[j], canon[j]) for j in range(1, len(canon))):
                raise _NeedsConcrete("the loop body differs between iterations", key, peel=True)
        b2 = bodies[-1]
        count = (var.hi - var.lo) // var.step + 1
        if expand:
            if any("alloc" in st for b in bodies for st in b):  # a named or placed tile (its own alloc)
                raise _NeedsConcrete("a loop written out allocates a named or placed tile", key)
            var.final = r[count - 1]
            self.body.extend(self._expand_piece(bodies, name, r[:count], dropped))
            return count
        if passes == 2:
            for n2, n1 in zip(_alloc_names(b2), _alloc_names(body)):
                if n2 != n1:
                    self._alias[n2] = n1
        if not pairs:
            r = r[:count]
        var.final = r[-1]
        if kind == "affine" and self._write_conflict(body, name):
            kind = "sequential"  # verify_kernel would reject it as an affine loop; the unrolled trace had none
        lp = {"var": name, "start": r.start, "stop": r.stop, "step": r.step, "kind": kind, "body": body,
              "loc": loc}
        self.body.append({"loop": lp})
        return whole if pairs else count

    def _expand_piece(self, bodies, var, piece, dropped):
        """The statements of a loop over ``var`` for each index of ``piece`` in turn, as the unrolled trace writes
        them. ``bodies``: its passes, each taking its tiles from the enclosing body's pool as an unrolled iteration
        would (a line's tiles rotate over its storages, g = _group() passes in a cycle: consecutive passes take them
        in turn, after the ``dropped`` passes a comparison narrowed); iteration k is written with a pass that took
        its storages as iteration k would, the last with the last pass (its tiles are the ones the kernel's Python
        variables hold after the loop; _record_piece runs more passes until the last is the last iteration's). Tiles of
        loops inside the body are new in each iteration, as unrolled (the recorded names where a pass's body is
        first written, and the last pass's in the last iteration)."""
        slots = _slot_rank()
        inner = [_alloc_names(b) for b in bodies]
        out, used = [], [False] * len(bodies)
        n, m = len(piece), len(bodies) - 1
        g = self._group()
        for k, value in enumerate(piece):
            which = m if k == n - 1 else (k - dropped) % g
            keep = k == n - 1 if which == m else not used[which]
            ren = {} if keep else {nm: self.unique_name(nm) for nm in inner[which]}
            used[which] = True
            _expand_into(bodies[which], var, value, ren, slots, out)
        return out

    @staticmethod
    def _stale(storages, key):
        """Mark the tiles of ``storages`` (weak references) as an earlier iteration's of the loop ``key``."""
        for ref in storages:
            st = ref()
            if st is not None:
                st.stale = key

    def _canon(self, stmts, outside=()):
        """The canonical names of the tensors of ``stmts`` (a function of the name): the tiles they allocate
        numbered in order (names of other tensors kept); the tiles of ``outside`` (a pass's tiles taken from the
        enclosing body's pool, _record_piece: storages that two consecutive iterations take in turn) as one
        name. Two passes are the same when their statements are, so renamed (_same_renamed)."""
        local = {}
        for i, nm in enumerate(_alloc_names(stmts)):
            local[nm] = "#{}".format(i)
        return _CanonNames(local, self.resolve_alias, outside).__getitem__

    def _write_conflict(self, body, var):
        """True when an op of ``body`` writes (not accumulates) a location of a tensor not allocated in it whose
        index does not move with ``var``: verify_kernel's affine_range write check."""
        local = set(_alloc_names(body))
        pat = re.compile(r"\b{}\b".format(re.escape(var)))
        stack = [body]
        while stack:
            for st in stack.pop():
                if "loop" in st:
                    stack.append(st["loop"].get("body", []))
                    continue
                d = st.get("dst") if "op" in st else None
                if d is None or "accumulate" in (st.get("flags") or ()):
                    continue
                nm = self.resolve_alias(d if isinstance(d, str) else d["tensor"])
                if nm in local:
                    continue
                idx = [] if isinstance(d, str) else d.get("index", [])
                if not any(pat.search(e if isinstance(e, str) else e.get("start", "")
                                      if isinstance(e, dict) and isinstance(e.get("start"), str) else "")
                           for e in idx):
                    return True
        return False

    def _ir_values(self, stmt):
        """Sym values of a statement as kernel-IR index expressions (strings, or ints once their loops are
        done); a Sym anywhere else than an index start needs the loop unrolled."""
        for k, v in stmt.items():
            t = type(v)  # (exact types: statements hold plain dicts, lists, strings, numbers and Syms)
            if t is dict:
                idx = v.get("index")
                if idx is None:
                    continue
                for j, e in enumerate(idx):
                    te = type(e)
                    if te is Sym:
                        idx[j] = e.expr()
                    elif te is dict:
                        for kk, x in e.items():
                            if type(x) is Sym:
                                if kk != "start":
                                    x._need("a '{}' of an index".format(kk))
                                e[kk] = x.expr()
            elif t is Sym:
                v = v.resolved()
                if isinstance(v, Sym):
                    v._need("an operand '{}'".format(k))
                stmt[k] = v
            elif (t is list or t is tuple) and k != "loc":
                if any(type(x) is Sym for x in v):
                    # iota's / affine_select's pattern and a matmul's PE tile (iimm) may hold index expressions
                    # (_isa.IIMM_EXPR_OPS); other immediates not
                    expr = k == "iimm" and stmt.get("op") in _isa.IIMM_EXPR_OPS
                    stmt[k] = [(x.expr() if expr else x._need("an immediate '{}'".format(k))) if type(x) is Sym else x
                               for x in v]

    def eager(self):
        """The eager-values state of this kernel (created on first use: kernels that never look at a
        value pay nothing)."""
        if self._eager is None:
            self._eager = _Eager(self)
        return self._eager

    def constant(self, array, name=None):
        """An HBM input tensor holding ``array`` (``nl.shared_constant``)."""
        a = np.ascontiguousarray(array)
        t = self.hbm_tensor(name or "const", a.dtype, a.shape if a.ndim else (1,), kind="input")
        t._st.buffer = HbmRegion("shared_hbm")  # a shared_hbm tensor (nki-api.md 3.4)
        self.constants[t.name] = a.reshape(-1) if a.ndim == 0 else a
        return t

    # context
    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        _stack().remove(self)
        return False

    # names
    def unique_name(self, base, numbered=False):
        base = "".join(c if (c.isalnum() or c == "_") else "_" for c in (base or "t")) or "t"
        if numbered:
            while True:
                n = "{}{}".format(base, next(self.counter))
                if n not in self.names:
                    self.names.add(n)
                    return n
        if base not in self.names:
            self.names.add(base)
            return base
        while True:
            n = "{}_{}".format(base, next(self.counter))
            if n not in self.names:
                self.names.add(n)
                return n

    # tensors
    def hbm_tensor(self, name, dtype, shape, kind="internal", loc=None, private=False, grid_shared=False):
        """A kernel-level HBM tensor. ``private``: a ``private_hbm`` tensor, which under LNC=2 is this core's
        own (its name carries the core, so the launch's programs never share it). ``grid_shared``: the one
        tensor of a launch grid's instances (a ``shared_hbm`` tensor of a Beta-1 kernel launched on a grid),
        made by the first: it may be made in the body of a launch grid's loop (GRID_LOOP keys)."""
        if self._recs and not (grid_shared and all(len(x.key) == 4 and x.key[2] == GRID_LOOP for x in self._recs)):
            raise _NeedsConcrete("an HBM tensor made in the loop body")
        dt = dtype_name(dtype)
        shape = tuple(int(s) for s in shape)
        if not shape or any(s < 1 for s in shape):
            raise make_error("BadTensorShape", "bad HBM tensor shape {}".format(shape))
        name = name or (assigned_name() if kind == "internal" else None)
        if private and self.lnc[1] > 1:
            name = "{}__core{}".format(name or "hbm", self.lnc[0])
        name = self.unique_name(name or "hbm", numbered=not name)
        if self._affine:
            self._birth[name] = frozenset(f.stamp for f in self._affine)
        if kind == "internal" and not private:
            self.shared_hbm.add(name)
        shared = (kind == "internal" and not private) or (kind != "internal" and self.lnc[1] > 1)
        st = _Storage(name, HbmRegion("shared_hbm" if shared else "private_hbm"), dt, shape)
        d = {"name": name, "buffer": "hbm", "kind": kind, "dtype": dt, "shape": list(shape)}
        self.tensors.append(d)
        self.storage[name] = st
        self.buffers[name] = "hbm"
        self.shapes[name] = shape
        self.itemsizes[name] = np_dtype(dt).itemsize
        return self.tensor_cls(st, None, self)

    def tile(self, buffer, dtype, shape, name=None, address=None):
        dt = dtype_name(dtype)
        shape = tuple(map(int, shape))
        if buffer not in ON_CHIP:
            raise make_error("UnknownBuffer", "bad on-chip buffer {!r}".format(buffer))
        if len(shape) < 2 or len(shape) > 5 or min(shape) < 1:
            raise make_error("BadTensorShape", "an on-chip tensor needs 2..5 positive dims (partition "
                             "dim first), got shape {}".format(shape))
        # (the lines of nsim's frames between this call and the user's line, for the pool key below, from their
        # positions gathered on the way to the user's frame: lines alone, the sites differ by them)
        pos = []
        frame = user_frame(1, pos)
        caller = frame.f_back if frame is not None else None
        # The site (the pool key's lines, below) and the variable the statement assigns to depend only on the
        # code and instruction offsets of the frames passed and of the user's frame and its caller: looked up
        # once per such position (a tile made by a line run before: one dict lookup instead of the line-table
        # reads and the assignment lookup). The entry keeps the code objects, so the ids in its key stay theirs.
        if frame is not None:
            pos.append(id(frame.f_code))
            pos.append(frame.f_lasti)
            if caller is not None:
                pos.append(id(caller.f_code))
                pos.append(caller.f_lasti)
        pk = tuple(pos)
        site = _TILE_SITES.get(pk)
        if site is None:
            inner = _inner_lines(tuple(pos[:-4 if caller is not None else -2] if frame is not None else pos),
                                 sys._getframe(1), frame)
            site = _TILE_SITES[pk] = (
                None if frame is None else (frame.f_code.co_filename, _lineno(frame),
                                            caller.f_code.co_filename if caller is not None else None,
                                            _lineno(caller) if caller is not None else 0, inner),
                assigned_name(frame), frame.f_code if frame is not None else None,
                caller.f_code if caller is not None else None)
        hint = None if name else site[1]
        # The pool of reusable storage is per allocation site (file, line, and the line that called it) and
        # kind: a tile takes the storage of a dead tile made by the same nl.ndarray line, as the compiler rotates
        # one allocation's buffers over a loop's iterations. Tiles of different lines never share here (the
        # compiler model's liveness allocation decides that): sharing by kind alone put, say, a loop's input
        # tile and its result tile (same shape) in one storage, an ordering the compiled kernel does not have.
        # A helper's line called from two places is two allocations, as after inlining (by line alone, the
        # unrolled trace rotated a helper's tiles for K^T and for each query block over one line's two
        # storages, where the kept trace gives the K^T loop its own buffers: attention 4-25 % apart). A reused
        # storage keeps its first name.
        # One statement making several tiles of one kind through nsim's own calls (a partition broadcast's copy
        # and the op's result) makes them at different nsim lines: those are part of the site too (by the user's
        # line alone they were one line run twice per pass, each given one buffer of the other's pool: a kept loop
        # of `tensor_tensor(d, b.broadcast_to(...))` waited for its previous iteration, 28.4 us against 17.7 us
        # unrolled).
        key = (buffer, dt, shape) if frame is None else (buffer, dt, shape) + site[0]
        if self._broken is not None:
            raise _NeedsConcrete("a loop recorded symbolically was left early", self._broken)
        recs = self._recs
        if recs and (recs[-1].pairs or recs[-1].pool) and not name and address is None:
            # a loop recorded two iterations per pass (a peeled loop allocating tiles): the tile takes its line's
            # storages as the enclosing body (or the kernel) would, its alloc statement before the loop
            pairs = recs[_body_rec_index(recs) + 1:]
            saved, self.body = self.body, pairs[0].outer_body
            try:
                t = self._tile(buffer, dt, shape, name, address, key, hint, _body_rec(recs), frame)
            finally:
                self.body = saved
            nm = t._st.name
            for x in pairs:
                x.storages.append(weakref.ref(t._st))
                x.local.add(nm)
            return t
        return self._tile(buffer, dt, shape, name, address, key, hint, recs[-1] if recs else None, frame)

    def _tile(self, buffer, dt, shape, name, address, key, hint, rec, frame):
        """tile(): a tile of pool key ``key`` in the body of the loop being recorded ``rec`` (None: in the
        kernel's body, loops unrolled), made at the user's frame ``frame``."""
        if rec is not None:  # a tile of a loop body: its alloc statement runs every iteration (rotating buffers)
            free = self._pool_free.get(key)
            if free and self.reuse_tiles and not name and address is None:
                # reuse a dead tile allocated earlier in this pass of the body (its alloc runs every iteration)
                j = 0
                while j < len(free):
                    nm = free[j]
                    if nm not in rec.names:
                        if nm in self._loop_names and not any(nm in r.names for r in self._recs):
                            # a tile of a pass that has ended: no pass can take it again (a pass's names are
                            # its own new tiles); dropped, else the list grows with every pass of every
                            # loop of this line and each tile made scans it (the flash attention sample,
                            # 16 heads at seq 16384: most of the trace's time)
                            del free[j]
                            continue
                        j += 1
                        continue
                    if nm in self._site_last.get(key, ()):
                        j += 1
                        continue
                    del free[j]
                    self._took(key, nm)
                    rec.takes[key] = rec.takes.get(key, 0) + 1
                    rec.local.add(nm)
                    if hint:
                        self._vars.setdefault(nm, []).append(hint)
                    if self._affine:
                        self._birth[nm] = frozenset(f.stamp for f in self._affine)
                    st = _Storage(nm, buffer, dt, shape)
                    rec.storages.append(weakref.ref(st))
                    self._track(st, key)
                    self._fresh_storage(nm, buffer)
                    return self.tensor_cls(st, None, self)
            nm = self.unique_name(name or hint or "t", numbered=not (name or hint))
            self._took(key, nm)
            rec.names.add(nm)
            rec.local.add(nm)
            self._loop_names.add(nm)
            self._note_birth(nm, hint)
            st = self._alloc_storage(nm, buffer, dt, shape, address, frame)
            rec.storages.append(weakref.ref(st))
            if not name:
                self._track(st, key)
                if address is None:
                    rec.takes[key] = rec.takes.get(key, 0) + 1
                    # A line whose tiles already rotate over several storages within one pass of the body (an
                    # unrolled loop inside it) keeps that rotation across the kept loop's iterations: its n
                    # allocations there are marked "site_count": n, and the allocator gives each ceil(D / n) of
                    # the automatic depth D (compiler.loop_buffers; frontend/compiler/allocate.cpp): about the
                    # unrolled trace's storages (which rotates a line's tiles over max(n, D)), not n times D.
                    sa = rec.site_allocs.setdefault(key, [])
                    sa.append(self._last_alloc)
                    for a in sa:
                        a["site_count"] = len(sa)
                    if len(sa) == 1:
                        del sa[0]["site_count"]
            return self.tensor_cls(st, None, self)
        if self.reuse_tiles and not name and address is None:
            # Reuse the storage of a tile of the same kind whose Python object is gone: the kernel can no
            # longer reach it, so this is the compiler's buffer reuse; it keeps SBUF bounded when loops
            # are unrolled. Least recently freed first, and never the storage of one of the line's latest
            # compiler.loop_buffers - 1 tiles: a line's tiles rotate over that many storages, as the compiler
            # gives a loop-body allocation that many buffers (docs/timing-model.md "Buffers"), even when the
            # kernel drops each tile before allocating the next (`rt = rc` after a cast).
            free = self._pool_free.get(key)
            while free and free[0] in self._loop_names:  # tiles of loop bodies stay in their loop
                free.pop(0)
            recent = self._site_last.get(key, ())
            pick = next((j for j, nm in enumerate(free) if nm not in recent), None) if free else None
            if pick is not None:
                nm = free.pop(pick)
                self._took(key, nm)
                self._note_birth(nm, hint)
                st = _Storage(nm, buffer, dt, shape)
                self._track(st, key)
                self._fresh_storage(nm, buffer)
                return self.tensor_cls(st, None, self)
        nm = self.unique_name(name or hint or "t", numbered=not (name or hint))
        self._took(key, nm)
        self._note_birth(nm, hint)
        st = self._alloc_storage(nm, buffer, dt, shape, address, frame)
        if not name:
            self._track(st, key)
        return self.tensor_cls(st, None, self)

    def _took(self, key, nm):
        """The latest tile of pool key ``key`` (its line and kind) has storage ``nm``."""
        prev = self._site_last.get(key, ())
        self._latest = (key, prev)
        keep = self._recent_kept(key[0])
        self._site_last[key] = (prev + (nm,))[max(0, len(prev) + 1 - keep):] if keep > 0 else ()

    def _uneven_rotation(self, rec):
        """A line whose tiles the current pass of ``rec``'s body takes m >= 2 times (an inner loop written out or
        recorded in groups), where m and the line's rotating buffers D (compiler.loop_buffers; psum_loop_buffers)
        divide neither the other: (m, line, D), else None. The unrolled trace rotates the line's tiles over its D
        storages across the loop's iterations; kept, every iteration takes them in the same turn (its m allocations
        share D: "site_count"), and when neither divides the other the turns differ: with m = 5 and D = 4 the last
        tile of an iteration and the first of the next take one storage, and the next iteration's first write of it
        waits for the previous iteration's last read."""
        for key, m in rec.takes.items():
            d = self._recent_kept(key[0]) + 1
            if m >= 2 and d % m and m % d:
                where = "{}:{}".format(os.path.basename(key[3]), key[4]) if len(key) > 4 else "?"
                return m, where, d
        return None

    def _group(self):
        """Iterations per pass of a loop recorded in groups (a peeled loop allocating tiles, a loop written out):
        the least common multiple of the SBUF and PSUM rotating buffers (compiler.loop_buffers, psum_loop_buffers),
        so that every line's tiles take its storages in the same turn in every pass."""
        return math.lcm(self._recent_kept("sbuf") + 1, self._recent_kept("psum") + 1)

    def _recent_kept(self, buffer):
        """How many of a line's latest storages its next tile does not take: compiler.loop_buffers - 1 of the
        run's configuration (psum_loop_buffers - 1 in PSUM; the preset trn2's when that configuration is not
        valid: its error comes later)."""
        if self._nbufs is None:
            try:
                values = _isa.config_values(self.config, self.overrides)
            except NsimError:
                values = _isa.config_values("trn2")
            self._nbufs = (int(values["compiler.loop_buffers"]), int(values["compiler.psum_loop_buffers"]))
        return self._nbufs[1 if buffer == "psum" else 0] - 1

    def retarget(self, stmt, dst):
        """Point the destination of a statement already emitted at ``dst`` (an access dict or name: Beta 1
        ``t[k] = nl.load(..)`` and ``psum[...] += nc_matmul(..)`` write the view directly), with its loop
        indices written as kernel-IR expressions as emit() does."""
        stmt["dst"] = dst
        # The write is now to dst: what _track_accesses noted at emit() for the temporary holds for dst too (a
        # PSUM tile written by `p[...] = nc_matmul(..)` is no longer unwritten, so a later `p += nc_matmul(..)`
        # adds to it; the matmul opens its accumulation group on dst).
        name = dst if isinstance(dst, str) else dst["tensor"]
        self.written.add(name)
        self.unwritten_psum.discard(name)
        if self.buffers.get(name) == "psum":
            reg = self._region_of(dst, self)[1]
            self._close_groups(name, reg)
            if stmt["op"] in ("nc_matmul", "nc_matmul_mx"):
                self.open_groups.setdefault(name, set()).add(reg)
        if self._pending_fill:
            # a pending fill retargeted (``t[...] = nl.zeros(..)``) now fills ``dst``, not its temporary: track it
            # under dst when it fills all of it, else no longer (left under the temporary's name, the next fill of
            # that storage, the same line's next iteration, deleted it as dead although it wrote t)
            moved = [(k, ent) for k, ent in self._pending_fill.items() if ent[1] is stmt]
            for k, _ent in moved:
                del self._pending_fill[k]
            self._dead_fills(stmt)
            if moved and isinstance(dst, str):
                self._pending_fill[dst] = moved[-1][1]
        if self._symbolic:
            self._ir_values(stmt)

    def unused_storage(self, nm):
        """The tile just made with storage ``nm`` will never be accessed (Beta 1 ``t[i] = nl.load(..)``
        writes ``t[i]`` directly): its line's next tile may take that storage again, so a line whose tiles
        are all written elsewhere keeps one unused storage, not two in rotation."""
        if self._latest is not None and self._site_last.get(self._latest[0], ())[-1:] == (nm,):
            self._site_last[self._latest[0]] = self._latest[1]

    def _note_birth(self, nm, hint):
        """Tile ``nm`` starts a life: its variable name (``hint``) and the affine_range iterations it
        belongs to (the W504 check)."""
        if hint:
            self._vars.setdefault(nm, []).append(hint)
        if self._affine:
            self._birth[nm] = frozenset(f.stamp for f in self._affine)

    def _fresh_storage(self, nm, buffer):
        """Storage ``nm`` starts a new tile: no accumulation group is open on it, nothing has written it."""
        self.open_groups.pop(nm, None)
        if buffer == "psum":
            self.unwritten_psum.add(nm)

    def _alloc_storage(self, nm, buffer, dt, shape, address, frame=None):
        """New storage ``nm`` and its alloc statement. ``frame``: the user's frame making it, when known (its
        location is then not looked for again on the stack: emit() does for an alloc without one)."""
        self._fresh_storage(nm, buffer)
        st = _Storage(nm, buffer, dt, shape)
        self.buffers[nm] = buffer
        self.shapes[nm] = shape
        self.itemsizes[nm] = np_dtype(dt).itemsize
        alloc = {"name": nm, "buffer": buffer, "dtype": dt, "shape": list(shape)}
        if address is not None:
            alloc["address"] = int(address)
        if frame is not None and user_loc is _default_user_loc:  # (examples/export_from_library.py substitutes it)
            alloc["loc"] = _frame_loc(frame)
        self.emit({"alloc": alloc})
        self._last_alloc = alloc
        return st

    def _track(self, st, key):
        nm = st.name
        free = self._pool_free

        loop_names, recs = self._loop_names, self._recs

        def died(_ref, nm=nm, key=key):
            # a tile of a loop body is reused only in the same pass of the same body (its alloc is in it)
            if nm in loop_names:  # (the body looked for only then: this runs for every tile that dies)
                body_rec = _body_rec(recs)
                if body_rec is None or nm not in body_rec.names:
                    return
            free.setdefault(key, []).append(nm)

        self.pool.setdefault(key, []).append(weakref.ref(st, died))

    # statements
    def emit(self, stmt):
        if self._broken is not None:
            raise _NeedsConcrete("a loop recorded symbolically was left early", self._broken)
        self._nstmts += 1
        if self.progress is not None and self._nstmts % PROGRESS_STATEMENTS == 0:
            self.progress(self._nstmts)
        if self._nstmts > MAX_TRACED_STATEMENTS:
            raise make_error("ResourceLimit", "resource limit: the kernel traced more than {} statements "
                             "(loops that cannot be kept are unrolled while tracing); raise "
                             "nsim.tracer.MAX_TRACED_STATEMENTS or the "
                             "environment variable NSIM_MAX_TRACED_STATEMENTS".format(MAX_TRACED_STATEMENTS))
        if "op" in stmt:
            if self.label is not None:
                stmt["label"] = self.label
            if self.order_group:
                stmt["order_group"] = self.order_group
            if self.reg_after:
                stmt["after"] = list(dict.fromkeys(list(stmt.get("after", ())) + list(self.reg_after)))
            if "loc" not in stmt:
                stmt["loc"] = self._op_loc()
            self._track_accesses(stmt)
            if self._symbolic:
                self._ir_values(stmt)
        elif "alloc" in stmt and "loc" not in stmt["alloc"]:
            stmt["alloc"]["loc"] = user_loc()
        self.body.append(stmt)
        return stmt

    def _op_loc(self):
        """user_loc() plus the index of its call stack in self.stacks (when the line is not in the kernel
        function itself: a helper's or a library kernel's line)."""
        f = user_frame(1)  # (our caller, emit, is the tracer's)
        if f is None or user_loc is not _default_user_loc:
            return self._op_loc_of(f)
        # The location depends only on the code and instruction offset of the user's frame and of its callers up to
        # nsim's machinery (user_callers): looked up by them, the location made once per such chain of calls
        # (its line numbers, stack text and cache keys are each looked up per statement otherwise). The entry keeps
        # the user frame's code, so that the ids in its key stay that code's.
        key = [id(f.f_code), f.f_lasti]
        for g in user_callers(f):
            key.append(id(g.f_code))
            key.append(g.f_lasti)
        key = tuple(key)
        e = self._op_locs.get(key)
        if e is None or e[1] is not f.f_code:
            e = self._op_locs[key] = (self._op_loc_of(f), f.f_code)
        return e[0]

    def _op_loc_of(self, f):
        """_op_loc() of the user frame ``f``."""
        st = user_stack(f) if f is not None else ""
        i = None
        if st:
            i = self._stack_ids.get(st)
            if i is None:
                i = self._stack_ids[st] = len(self.stacks)
                self.stacks.append(st)
        if user_loc is not _default_user_loc:  # (examples/export_from_library.py substitutes user_loc)
            loc = user_loc()
            if i is not None:
                loc["stack"] = i
            return loc
        key = (f.f_code, _lineno(f), i) if f is not None else None
        loc = self._locs.get(key)
        if loc is None:
            loc = ({"file": f.f_code.co_filename, "line": key[1], "function": f.f_code.co_name} if f is not None
                   else {"file": "", "line": 0, "function": ""})
            if i is not None:
                loc["stack"] = i
            self._locs[key] = loc
        return loc

    def _operands(self, stmt):
        """(slot, operand) of ``stmt``, in table order."""
        fields = tuple(stmt)  # (its keys, in the order they were set: the same for most statements of one op)
        ks = _OPERAND_ORDER.get(fields)
        if ks is None:
            rank = _slot_rank()
            ks = [k for k in fields if k in rank]
            ks.sort(key=rank.__getitem__)
            ks = _OPERAND_ORDER[fields] = tuple(ks)
        return [(k, stmt[k]) for k in ks if stmt[k] is not None]

    @staticmethod
    def _region_of(v, tracer):
        if isinstance(v, str):  # the whole tensor: the same key as an explicit full slice
            shape = tracer.shapes.get(v)
            return v, (tuple((0, n - 1) for n in shape) if shape else None)
        if "dtype" in v and _access_units(v, tracer)[1] != tracer.itemsizes.get(v["tensor"]):
            return v["tensor"], None  # a view of another element size: taken as the whole tensor
        idx = v.get("index", [])
        reg = []
        for e in idx:
            if isinstance(e, (int, Sym)):
                reg.append((e, e))
            elif "broadcast" in e:
                s = e.get("start", 0)
                reg.append((s, s))
            else:
                s, n, st = e.get("start", 0), e.get("size", 1), e.get("step", 1)
                reg.append((s, s + (n - 1) * st))
        return v["tensor"], tuple(reg)

    @staticmethod
    def _overlap(a, b):
        if a is None or b is None:
            return True
        return all(x0 <= y1 and y0 <= x1 for (x0, x1), (y0, y1) in zip(a, b))

    def note_fill(self, name, zero=False):
        """The statement just emitted fills tile ``name`` whole (Beta-1 ``nl.zeros`` / ``ones`` / ``full``). If the
        next instruction that accesses the tile writes all of it without reading it, the fill is a dead store and
        is dropped, as the compiler drops it (the nki-samples flash attention zeroes its PSUM scores before every
        ``qk_psum[:, :] = nl.matmul(...)``; docs/timing-model.md). ``zero``: a fill with 0 (fold_zero_fill)."""
        self._pending_fill[name] = (self.body, self.body[-1], zero)

    def fold_zero_fill(self, name, access):
        """``psum += matmul`` as the next access of a zero-filled PSUM tile, written next to the fill (the same body,
        no loop in between: every pass of a loop does both), onto the whole tile: the matmul may start the
        accumulation group instead (0 + x is x), so the fill is dropped and the caller makes the matmul overwrite, as
        the compiler folds the zeroing into the group's first matmul. True when folded."""
        ent = self._pending_fill.get(name)
        if ent is None or not ent[2] or access != name or self.buffers.get(name) != "psum":
            return False
        if ent[0] is not self.body:
            # The fill next to a loop being recorded and the `+=` in its body (``ps = nl.zeros(..)`` then ``for k in
            # affine_range(K): ps += nc_matmul(..)``): the unrolled trace folds the fill into the first iteration's
            # matmul, where a kept loop would keep the memset and accumulate onto it in every iteration (the Beta 1
            # hadamard_matmul of tests/python/kernels/transform_kernels.py 7.6 % slower kept at n = 512). The loop
            # is peeled: its first iteration, next to the fill, folds it.
            for rec in self._recs:
                if rec.outer_body is ent[0] and not rec.pairs and not rec.pool and rec.key not in self.peel:
                    raise _NeedsConcrete("a `+=` matmul onto a PSUM tile zero-filled before the loop (the first "
                                         "iteration's matmul starts the group)", rec.key, peel=True)
            return False
        del self._pending_fill[name]
        lst, fill = ent[0], ent[1]
        for i in range(len(lst) - 1, -1, -1):
            if lst[i] is fill:
                del lst[i]
                return True
        return False

    # Instructions that write every element of their destination (when no flag below restricts them), and the
    # flags that make a write partial or read-modify-write: only these writes make a fill dead.
    _WHOLE_WRITERS = frozenset(("activate2", "activation", "activation_reduce", "affine_select", "dma_copy",
                                "dma_transpose", "exponential", "iota", "memset", "nc_matmul", "nc_transpose",
                                "reciprocal", "scalar_tensor_tensor", "tensor_copy", "tensor_reduce",
                                "tensor_scalar", "tensor_tensor", "tensor_tensor_scan"))
    _PARTIAL_FLAGS = frozenset(("accumulate", "dynamic_addr", "indirect_dst", "indirect_scalar", "oob_skip",
                                "reverse_pred"))

    def _dead_fills(self, stmt):
        """Settle the pending fills of the tiles ``stmt`` accesses: a whole-tile write that reads nothing of the
        tile, by an instruction that writes every element (not predicated, accumulating or addressed at run
        time), in the same body as the fill, makes the fill dead; any other access keeps it."""
        ops = list(self._operands(stmt))
        for name in {v if isinstance(v, str) else v["tensor"] for _, v in ops} & self._pending_fill.keys():
            lst, fill, _ = self._pending_fill.pop(name)
            # (a write in a loop after the fill might run no iteration: a runtime trip count, dynamic_range or
            # while_loop, may be 0; only a write next to the fill, in the same body, surely overwrites it)
            if fill is stmt or lst is not self.body or stmt.get("op") not in self._WHOLE_WRITERS or \
                    self._PARTIAL_FLAGS.intersection(stmt.get("flags") or ()):
                continue
            reads = any(slot not in _isa.OUT_SLOTS and (v if isinstance(v, str) else v["tensor"]) == name
                        for slot, v in ops)
            if not reads and any(slot in _isa.OUT_SLOTS and v == name for slot, v in ops):
                for i in range(len(lst) - 1, -1, -1):
                    if lst[i] is fill:
                        del lst[i]
                        break

    def _track_accesses(self, stmt):
        if self._pending_fill:
            self._dead_fills(stmt)
        if self._affine:
            self._affine_writes(stmt)
        if self.check and self._recs:
            self._affine_symbolic(stmt)
        is_mm = stmt["op"] in ("nc_matmul", "nc_matmul_mx")
        for slot, v in self._operands(stmt):
            name = v if isinstance(v, str) else v["tensor"]
            if slot in _isa.OUT_SLOTS:
                self.written.add(name)
                self.unwritten_psum.discard(name)
            else:
                self.read.add(name)
            if self.buffers.get(name) != "psum":  # only PSUM regions carry accumulation groups
                continue
            reg = self._region_of(v, self)[1]
            if is_mm and slot == "dst":
                self.open_groups.setdefault(name, set()).add(reg)
            else:  # any non-matmul access ends the accumulation groups of the elements it touches
                self._close_groups(name, reg)

    def _affine_symbolic(self, stmt):
        """The sanitizer's affine_range check for the affine loops being recorded symbolically: every write
        (not an accumulation) to a tensor not made in the loop body must move with the loop index far enough
        that two iterations never touch the same element, and the body must not read such a tensor it also
        writes. What cannot be shown here is checked exactly by unrolling the loop."""
        if "accumulate" in (stmt.get("flags") or ()):
            return
        # `t[...] += x` (tensor_tensor with dst = data1, a reduction operator): the same in any iteration order, as
        # in the exact check (_affine_writes); its write is still recorded, so another read of t in the body is not
        acc = ("dst", "data1") if _inplace_accumulation(stmt) else ()
        recs = self._recs
        for j, rec in enumerate(recs):
            if rec.kind != "affine":
                continue
            inner = recs[j:]  # tiles made in this loop's body or deeper are local to it
            for slot in _isa.WRITTEN_SLOTS:
                v = stmt.get(slot)
                if v is None:
                    continue
                name = v if isinstance(v, str) else v["tensor"]
                if any(name in x.local for x in inner):
                    continue
                if slot not in acc and not self._moves_apart(v, rec.var):
                    if stmt["op"] in ("nc_matmul", "nc_matmul_mx") and self.buffers.get(name) == "psum":
                        # a matmul opening an accumulation group (accumulate=None on a tile not made in the body):
                        # peeled, the group's first matmul runs with its int index and the others accumulate
                        raise _NeedsConcrete("an accumulation group opened in the body of the loop", rec.key,
                                             peel=True, sanitizer=True)
                    raise _NeedsConcrete("the sanitizer's affine_range check: a write that may not move with the "
                                         "index", rec.key, sanitizer=True)
                rec.written.add(name)
                if slot not in acc:  # (an accumulator is every iteration's: reading it is carried)
                    seen, key = rec.wregs.setdefault(name, {}), _access_key(v)
                    if key not in seen:
                        # another write of the tensor in the body: each moves apart, but one iteration's may meet
                        # another iteration's of the other (regions kept: the IR's starts become text later)
                        reg = _exact_region(v, self)
                        if not all(self._writes_apart(u, reg, rec.var) for u in seen.values()):
                            raise _NeedsConcrete("the sanitizer's affine_range check: two writes of a tensor that "
                                                 "may meet across iterations", rec.key, sanitizer=True)
                        seen[key] = reg
            for slot in _isa.READ_SLOTS:
                v = stmt.get(slot)
                if v is None or slot in acc:
                    continue
                name = v if isinstance(v, str) else v["tensor"]
                if any(name in x.local for x in inner):
                    continue
                # a read of exactly what this iteration wrote (its own slice, which moves apart): not carried
                w = rec.wregs.get(name)
                if not w or _access_key(v) not in w:
                    rec.read.add(name)
            if rec.written & rec.read:
                raise _NeedsConcrete("the sanitizer's affine_range check: the body reads a tensor it writes",
                                     rec.key, sanitizer=True)

    def _moves_apart(self, v, var):
        """True when the access ``v`` of two different values of ``var`` never shares an element."""
        if isinstance(v, str):
            return False
        idx = v.get("index", [])
        for e in idx:
            start, extent = (e, 1) if not isinstance(e, dict) else (e.get("start", 0), (e.get("size", 1) - 1) *
                                                                     e.get("step", 1) + 1)
            if not isinstance(start, Sym) or "broadcast" in (e if isinstance(e, dict) else ()):
                continue
            terms = start._open()[1]
            k = sum(c for x, c in terms if x is var)
            if not k:
                continue
            # indices of loops inside this one move the access within one iteration; outer ones are fixed
            inner = Sym(0, tuple((x, c) for x, c in terms if x.depth > var.depth))
            if inner.hi() - inner.lo() + extent <= abs(k):
                return True
        return False

    @staticmethod
    def _writes_apart(ru, rv, var):
        """True when the writes of regions ``ru`` and ``rv`` (_exact_region) of one tensor in the body of the loop of
        ``var``, each moving apart on its own, never touch the same element in two different iterations: on some dim
        of a common layout either their ranges over the whole loop are disjoint, or both move by the same step k and
        what they touch in one iteration spans at most |k| elements (a window moving by k). False when that cannot
        be shown (the loop is then checked exactly, unrolled)."""
        if ru.layout != rv.layout or len(ru) != len(rv):
            return Tracer._bytes_apart(ru, rv, var)

        def parts(start, n, step):
            """(the var's coefficient, the start without it, its terms of enclosing loops, the start without those
            either, the lowest / highest offsets)."""
            span = (int(n) - 1) * int(step)
            if not isinstance(start, Sym):
                return 0, start, {}, start, min(0, span), max(0, span)
            c, terms = start._open()
            k = sum(co for x, co in terms if x is var)
            return (k, Sym.make(c, tuple((x, co) for x, co in terms if x is not var)), _outer_terms(terms, var, {}),
                    Sym.make(c, tuple((x, co) for x, co in terms if x is not var and x.depth >= var.depth)),
                    min(0, span), max(0, span))

        def lo(x):
            return x.lo() if isinstance(x, Sym) else x

        def hi(x):
            return x.hi() if isinstance(x, Sym) else x

        for a, b in zip(ru, rv):
            (ka, ra, oa, ia, la, ha), (kb, rb, ob, ib, lb, hb) = parts(*a), parts(*b)
            if hi(a[0]) + ha < lo(b[0]) + lb or hi(b[0]) + hb < lo(a[0]) + la:  # apart over the whole loop
                return True
            if ka == kb != 0:
                # One window moving by k. Terms of enclosing loops (and launch grids) that both starts have alike
                # hold one value in the two iterations compared (their loops do not move while this one runs):
                # they shift both accesses alike and leave the window out (a head's row `2 pid + i_q_h`).
                if oa == ob:
                    ra, rb = ia, ib
                if max(hi(ra) + ha, hi(rb) + hb) - min(lo(ra) + la, lo(rb) + lb) < abs(ka):
                    return True
        return Tracer._bytes_apart(ru, rv, var)

    @staticmethod
    def _bytes_apart(ru, rv, var):
        """_writes_apart on the tensor's bytes (regions of different layouts: a reshape, a view of another element
        size): the byte range each touches over the whole loop disjoint, or both moving by the same number of bytes
        per iteration within one window of that many bytes."""
        def window(reg):
            """(bytes per unit of var, lowest / highest byte without the var's term, the whole range, the bytes per
            unit of each enclosing loop's index, lowest / highest byte without those terms either)."""
            shape, strides, unit = reg.layout
            dims = list(reg) + [(0, n, 1) for n in shape[len(reg):]]
            k, lo_, hi_, ilo, ihi = 0, 0, 0, 0, 0
            outer = {}
            for (start, n, step), st in zip(dims, strides):
                span = (int(n) - 1) * int(step) * int(st)
                lo_, hi_ = lo_ + min(0, span), hi_ + max(0, span)
                ilo, ihi = ilo + min(0, span), ihi + max(0, span)
                if isinstance(start, Sym):
                    c0, terms = start._open()
                    k += sum(co for x, co in terms if x is var) * int(st)
                    rest = Sym.make(c0, tuple((x, co) for x, co in terms if x is not var))
                    lo_, hi_ = lo_ + (rest.lo() if isinstance(rest, Sym) else rest) * int(st), \
                        hi_ + (rest.hi() if isinstance(rest, Sym) else rest) * int(st)
                    inner = Sym.make(c0, tuple((x, co) for x, co in terms if x is not var and x.depth >= var.depth))
                    ilo, ihi = ilo + (inner.lo() if isinstance(inner, Sym) else inner) * int(st), \
                        ihi + (inner.hi() if isinstance(inner, Sym) else inner) * int(st)
                    _outer_terms(terms, var, outer, int(st) * unit)
                else:
                    lo_, hi_ = lo_ + int(start) * int(st), hi_ + int(start) * int(st)
                    ilo, ihi = ilo + int(start) * int(st), ihi + int(start) * int(st)
            # (strides are positive: a term's lowest value times the stride is the lowest offset)
            full = (lo_ + min(k * var.lo, k * var.hi), hi_ + max(k * var.lo, k * var.hi))
            return (k * unit, lo_ * unit, hi_ * unit + unit - 1, full[0] * unit, full[1] * unit + unit - 1, outer,
                    ilo * unit, ihi * unit + unit - 1)

        try:
            ka, la, ha, fla, fha, oa, ila, iha = window(ru)
            kb, lb, hb, flb, fhb, ob, ilb, ihb = window(rv)
        except (TypeError, ValueError):
            return False
        if fha < flb or fhb < fla:
            return True
        if oa == ob:  # enclosing loops' terms alike in both (bytes per unit): one value in the iterations compared
            la, ha, lb, hb = ila, iha, ilb, ihb
        return ka == kb != 0 and max(ha, hb) - min(la, lb) < abs(ka)

    def _affine_writes(self, stmt):
        """The sanitizer's affine_range check: a write (not an accumulation) to bytes an earlier iteration
        of an enclosing affine_range wrote, to a tensor that is not the iteration's own."""
        flags = stmt.get("flags") or ()
        if "accumulate" in flags:
            return  # accumulation (PSUM matmul groups, dma_copy +=) is a legal reduction across iterations
        # the runtime-indexed side of an indirect DMA (a scatter's dst, a gather's src): its rows are values the
        # check cannot see (its static access is row 0 in every iteration), so it is not checked (as NSIM-W506)
        runtime = (("dst",) if "indirect_dst" in flags else ("src",)) if "offsets" in stmt else ()
        # `t[...] += x` on a tile (the NKI mamba sample's scanC_accum): its accumulator is the same in any
        # iteration order, so neither its read (data1) nor its write is checked; the write is still recorded,
        # so another access of t in a later iteration is.
        acc = ("dst", "data1") if _inplace_accumulation(stmt) else ()
        read_slots = _isa.READ_SLOTS
        for slot, v in stmt.items():  # loop-carried reads: bytes another iteration wrote
            if slot not in read_slots or slot in acc or slot in runtime:
                continue
            name = v if isinstance(v, str) else v["tensor"]
            reg = None
            for f in self._affine:
                seen = f.writes.get(name)
                if not seen or f.reported:
                    continue
                reg = reg or _exact_region(v, self)
                for it, r, loc in seen:
                    if it != f.iteration and _regions_overlap(r, reg):
                        f.reported = True
                        self._report_affine(stmt, slot, name, f, it, loc, read=True)
                        break
        for slot in _isa.WRITTEN_SLOTS:
            v = stmt.get(slot)
            if v is None or slot in runtime:
                continue
            name = v if isinstance(v, str) else v["tensor"]
            reg = None  # (worked out for the first frame that checks it: a tile made in every frame's body needs none)
            born = self._birth.get(name, ())
            for f in self._affine:
                if f.stamp in born:
                    continue
                if reg is None:
                    reg = _exact_region(v, self)
                for r0 in reg:  # the writes of every iteration of a symbolic loop inside f: not representable
                    if isinstance(r0[0], Sym):
                        for x, _k in r0[0]._open()[1]:
                            if x.depth >= f.nrecs:
                                raise _NeedsConcrete("the sanitizer's affine_range check of an enclosing unrolled "
                                                     "loop", x.key, sanitizer=True)
                seen = f.writes.setdefault(name, [])
                if not f.reported and slot not in acc:
                    for it, r, loc in seen:
                        if it != f.iteration and _regions_overlap(r, reg):
                            f.reported = True
                            self._report_affine(stmt, slot, name, f, it, loc)
                            break
                if len(seen) < _AFFINE_MAX_WRITES:
                    seen.append((f.iteration, reg, stmt.get("loc")))

    def _report_affine(self, stmt, slot, name, f, it, loc, read=False):
        info = check_info("affine-write-conflict")
        where = stmt.get("loc") or {}
        first = "{}:{}".format(os.path.basename(loc.get("file", "")), loc.get("line", 0)) if loc else "?"
        detail = ("iteration {} of the affine_range at {}:{} {} {} bytes that iteration {} wrote (at {}){}; "
                  "affine_range iterations may run in any order").format(
                      f.iteration, os.path.basename(f.loc.get("file", "")), f.loc.get("line", 0),
                      "reads" if read else "writes", slot, it, first,
                      " (a loop-carried dependency)" if read else "")
        r = {"code": info["code"], "check": info["check"], "fix": info["fix"], "op": stmt["op"], "tensor": name,
             "slot": -1, "detail": detail, "file": where.get("file", ""), "line": where.get("line", 0),
             "function": where.get("function", ""), "instruction": -1, "count": 1}
        r["message"] = "{} {}: {} on '{}' ({}){}. Fix: {}".format(
            r["code"], r["check"], r["op"], name, detail,
            " [at {}:{} ({})]".format(r["file"], r["line"], r["function"]) if r["file"] else "", r["fix"])
        self.check_reports.append(r)

    def matmul_accumulates(self, dst, accumulate):
        """nc_matmul(accumulate=None): overwrite unless a matmul already opened a group on exactly this
        PSUM region (and no other instruction touched it since)."""
        if accumulate is not None:
            return bool(accumulate)
        # In a loop recorded symbolically the answer must be the same in every iteration: it is, when it is the
        # same in the body's two passes (the statements are compared; a difference peels the loop, whose first
        # iteration, the group's first matmul, then runs with its int index). The region's membership in
        # open_groups at the end of a pass is set by the body's last access to it, the same in every pass, so
        # from the second pass on every iteration starts from the same membership.
        # The flag is per element (nki-api.md 2.1): a region inside an open group accumulates, one that meets no open
        # group overwrites; a matmul over elements of both kinds would do both at once, which one instruction of
        # the IR cannot say: an error naming the fix (pass accumulate= explicitly).
        acc = dst.access()
        name, reg = self._region_of(acc, self)
        groups = self.open_groups.get(name, ())
        if reg in groups:
            return True
        if reg is not None and any(g is not None and self._inside(reg, g) for g in groups):
            return True
        if self._covered(reg, groups):
            return True
        if any(self._overlap(g, reg) for g in groups):
            raise make_error("NotSupported", "nc_matmul(accumulate=None) into a PSUM region of '{}' whose elements are "
                             "partly in an open accumulation group: it would accumulate into some and overwrite "
                             "others; pass accumulate=True or accumulate=False".format(name))
        return False

    def _close_groups(self, name, reg):
        """An access other than a matmul's to region ``reg`` of PSUM tensor ``name`` ends the accumulation groups of
        its elements (per element, nki-api.md 2.1): the part of an open group outside ``reg`` stays open. (Bounds
        that are loop-index expressions, or an access of another element size: the whole group ends.)"""
        groups = self.open_groups.get(name)
        if not groups:
            return
        for g in [g for g in groups if self._overlap(g, reg)]:
            groups.discard(g)
            if g is not None and reg is not None and all(type(x) is int for box in (g, reg) for d in box for x in d):
                groups.update(self._box_minus(g, reg))

    @staticmethod
    def _box_minus(a, b):
        """The part of box ``a`` outside box ``b`` (per-dim inclusive int bounds, the two overlapping), as boxes."""
        out, cur = [], list(a)
        for d, (y0, y1) in enumerate(b):
            lo, hi = cur[d]
            if y0 > lo:
                out.append(tuple(cur[:d] + [(lo, y0 - 1)] + cur[d + 1:]))
                lo = y0
            if y1 < hi:
                out.append(tuple(cur[:d] + [(y1 + 1, hi)] + cur[d + 1:]))
                hi = y1
            cur[d] = (lo, hi)
        return out

    def _covered(self, reg, groups):
        """Whether the open groups (int bounds) together cover every element of ``reg`` (int bounds)."""
        def ints(box):
            return box is not None and all(type(x) is int for d in box for x in d)
        if not ints(reg):
            return False
        rest = [reg]
        for g in groups:
            if not ints(g):
                continue
            rest = [part for r in rest for part in (self._box_minus(r, g) if self._overlap(r, g) else [r])]
            if not rest:
                return True
        return False

    @staticmethod
    def _inside(a, b):
        """Whether region ``a`` lies inside region ``b`` (both per-dim (lo, hi) bounds)."""
        return all(y0 <= x0 and x1 <= y1 for (x0, x1), (y0, y1) in zip(a, b))

    def name_shared_tiles(self):
        """A tile storage reused for several variables (the compiler's buffer reuse of dead tiles) is named
        after all of them ("at_or_bt"), so no message names one variable for another's data."""
        rename = {}
        for nm, hints in self._vars.items():
            if nm in self._alias:
                continue
            distinct = list(dict.fromkeys(hints))
            if len(distinct) > 1:
                rename[nm] = self.unique_name("_or_".join(distinct[:3]) + ("_etc" if len(distinct) > 3 else ""))
        for nm in self._alias:  # tiles of a loop's checking pass are the recorded pass's
            t = self.resolve_alias(nm)
            rename[nm] = rename.get(t, t)
        if not rename:
            return
        slots = frozenset(_slot_keys())
        stack = [self.body]
        while stack:
            self._rename_in(stack.pop(), rename, slots, stack)
        for r in self.check_reports:
            r["tensor"] = rename.get(r["tensor"], r["tensor"])
        self._vars = {}

    @staticmethod
    def _rename_in(body, rename, slots, stack):
        for st in body:
            if "loop" in st:
                stack.append(st["loop"].get("body", []))
                continue
            a = st.get("alloc")
            if a is not None:
                if a["name"] in rename:
                    a["name"] = rename[a["name"]]
                continue
            for k, v in st.items():
                if k in slots:
                    if isinstance(v, str):
                        if v in rename:
                            st[k] = rename[v]
                    elif v.get("tensor") in rename:
                        v["tensor"] = rename[v["tensor"]]

    def to_json(self):
        k = {"nsim_kernel": 1, "name": self.name, "tensors": [dict(t) for t in self.tensors], "body": self.body}
        if self.stacks:
            k["stacks"] = list(self.stacks)
        if self.schedule:
            k["schedule"] = [[a, list(b)] for a, b in self.schedule]
        return k

    def labels(self):
        """The op labels (nisa ``name=``) of the kernel body."""
        out = set()
        stack = [self.body]
        while stack:
            for s in stack.pop():
                if "op" in s:
                    if "label" in s:
                        out.add(s["label"])
                elif "loop" in s:
                    stack.append(s["loop"].get("body", []))
        return out

    def set_schedule(self, edges):
        """Attach ``with_schedule`` edges [(after, [before, ...]), ...] after tracing; every name must be the
        ``name=`` of an instruction of this kernel (UnknownName otherwise)."""
        if not edges:
            return
        known = self.labels()
        for after, before in edges:
            for nm in [after] + list(before):
                if nm not in known:
                    raise make_error("UnknownName", "with_schedule: no instruction of kernel '{}' is "
                                     "named '{}' (name= of an nisa call); names in this kernel: {}".format(
                                         self.name, nm, ", ".join(sorted(known)) or "none"))
        self.schedule = [(after, list(before)) for after, before in edges]


# --------------------------------------------------------------------------------------------------
# Scheduling directives: nisa name= labels and no_reorder blocks
# --------------------------------------------------------------------------------------------------


class labelled:
    """``with labelled(name):`` every op emitted inside (by one nisa call) carries ``"label": name``. An
    enclosing label wins (a Beta-1 or nl wrapper that calls another nisa function keeps its own name)."""

    __slots__ = ("name", "_tr")

    def __init__(self, name):
        if not isinstance(name, str) or not name:
            raise make_error("BadInstructionName", "name= of an instruction must be a non-empty string, got "
                             "{!r}".format(name))
        self.name = name
        self._tr = None

    def __enter__(self):
        tr = active()
        if tr is not None and tr.label is None:
            tr.label = self.name
            self._tr = tr
        return self

    def __exit__(self, *exc):
        if self._tr is not None:
            self._tr.label = None
            self._tr = None
        return False


class NoReorder:
    """``with nl.no_reorder():`` (also ``nki.compiler.no_reorder()``): every op emitted inside carries the
    same ``order_group`` id, fresh for each outermost block (nested blocks share the outer id); the
    scheduler keeps such ops in program order. Dynamic loops are not allowed inside (see
    :func:`check_dynamic_loop`). Outside a kernel it does nothing. Also usable as a decorator."""

    __slots__ = ("_tr", "_prev")

    def __init__(self):
        self._tr = None
        self._prev = 0

    def __enter__(self):
        tr = active()
        if tr is not None:
            if tr._reorder_depth == 0:
                # inside a runtime loop (runtime_loop) the block joins the loop's group, kept after the block
                self._prev = tr.order_group
                tr.order_group = self._prev or next(tr._order_groups)
            tr._reorder_depth += 1
            self._tr = tr
        return self

    def __exit__(self, *exc):
        tr, self._tr = self._tr, None
        if tr is not None:
            tr._reorder_depth -= 1
            if tr._reorder_depth == 0:
                tr.order_group = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*a, **k):
            with NoReorder():
                return fn(*a, **k)

        return wrapped

    def __repr__(self):
        return "no_reorder()"


def check_dynamic_loop(what):
    """Dynamic (runtime) loops cannot be used inside ``no_reorder`` (spec compiler.md §1)."""
    tr = active()
    if tr is not None and tr._reorder_depth:
        raise make_error("DynamicLoopInNoReorder", "{} is a dynamic loop and cannot be used inside a no_reorder "
                         "block (only static loops, which are unrolled, are allowed there)".format(what))


class runtime_loop:
    """``with runtime_loop():`` the body of a runtime loop (``dynamic_range`` / ``fori_loop`` / ``while_loop``),
    which runs on the sequencers: no reordering across its iterations (spec compiler.md §1), so nsim, which
    unrolls it while tracing, gives every op emitted inside one ``order_group`` (fresh per outermost runtime
    loop; a nested one shares it): the scheduler keeps the loop's ops in program order, iterations neither
    overlap nor get software-pipelined.

    The sequencers branch on the loop's registers: ``waits`` (register_load labels, :func:`register_loads`)
    are added to every op emitted inside (kernel.json ``"after"``), and :meth:`wait_for` sets more (a
    ``while_loop``'s exit register, loaded again in each iteration: its latest load)."""

    __slots__ = ("_tr", "_waits", "_outer")

    def __init__(self, waits=()):
        self._waits = tuple(waits)

    def __enter__(self):
        tr = active()
        self._tr = None
        self._outer = None
        if tr is not None and not tr.order_group:
            tr.order_group = next(tr._order_groups)
            self._tr = tr
        if tr is not None:
            self._outer = (tr, tr.reg_after)
            self.wait_for(self._waits)
        return self

    def wait_for(self, waits):
        """From now on until the loop ends (or the next call), the ops emitted also wait for ``waits``."""
        if self._outer is not None:
            tr, outer = self._outer
            tr.reg_after = tuple(dict.fromkeys(outer + self._waits + tuple(waits)))

    def __exit__(self, *exc):
        if self._outer is not None:
            self._outer[0].reg_after = self._outer[1]
            self._outer = None
        if self._tr is not None:
            self._tr.order_group = 0
            self._tr = None
        return False


def runtime_range(r, waits=()):
    """Iterate range ``r`` as a runtime loop (:func:`runtime_loop`) waiting for ``waits``."""
    with runtime_loop(waits):
        for i in r:
            yield i


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------


def _is_array(x):
    return isinstance(x, np.ndarray) or (type(x).__module__.startswith("torch") and hasattr(x, "numpy"))


class shown:
    """``x`` as an error message shows what the kernel passed where a tensor belongs (``"got {!r}".format(shown(x))``):
    its repr, but a host array (numpy or torch) by its shape and dtype, with what makes it a kernel tensor (its
    repr printed every value), and a long repr cut short."""

    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

    def __repr__(self):
        x = self.x
        if _is_array(x):
            return ("a host {} array of shape {} and dtype {} (a kernel reads the arrays passed as its arguments, "
                    "and those inside list, tuple and dict arguments; pass it as one)").format(
                        "torch" if type(x).__module__.startswith("torch") else "numpy", tuple(x.shape),
                        str(x.dtype).replace("torch.", ""))
        r = repr(x)
        return r if len(r) <= 200 else r[:197] + "..."


class TraceResult:
    """What one traced call produced: the kernel dict and how to map results back."""

    def __init__(self, kernel, inputs, ret_spec, writeback, check_reports=(), split_sites=()):
        self.check_reports = list(check_reports)  # the sanitizer's reports found while tracing
        self.split_sites = set(split_sites)  # Tracer.split_sites
        self.kernel = kernel
        self.inputs = inputs  # IR name -> numpy array
        self.ret_spec = ret_spec  # nested structure of output names / None / passthrough
        self.writeback = writeback  # list of (caller array, IR output name)


def trace_lnc(fn, args, kwargs, lnc, name=None, **kw):
    """Trace ``fn`` once per physical core of an LNC=``lnc`` launch (``nl.program_id(0)`` = the core) and
    combine the programs into one multi-core kernel dict (docs/kernel-json.md, "Multi-core launches"):
    HBM tensors of the same name are one tensor (arguments and ``shared_hbm``; ``private_hbm`` names
    carry their core). The return value is the last core's (the same shared tensors)."""
    results = [trace(fn, args, kwargs, name=name, lnc=(c, lnc), **kw) for c in range(lnc)]
    progs, outputs = [], set()
    for r in results:
        for t in r.kernel["tensors"]:
            if t["kind"] == "output":
                outputs.add(t["name"])
    written = [_written_tensors(r.kernel["body"]) for r in results]
    # an output that no program writes stays an output of every program, so that verify reports it
    # (OutputNotWritten, as for one core) instead of the launch returning None for it
    unwritten = {n for n in outputs if not any(n in w for w in written)}
    for r, wrote in zip(results, written):
        k = {key: v for key, v in r.kernel.items() if key not in ("nsim_kernel", "name")}
        # an output of the launch is an output of each program that writes it (verify: outputs are written)
        wrote = wrote | unwritten
        k["tensors"] = [dict(t, kind="output" if t["name"] in wrote else "internal")
                        if t["name"] in outputs and t["kind"] != "input" else dict(t) for t in k["tensors"]]
        # (a written argument's output starts as its copy, "init", made before the launch runs: no core
        # copies it, so no core can overwrite the other's results with it)
        progs.append(k)
    last = results[-1]
    inputs, writeback, reports = {}, [], []
    for r in results:
        inputs.update(r.inputs)
        reports.extend(r.check_reports)
        for arr, nm in r.writeback:
            if all(nm != n2 for _a, n2 in writeback):
                writeback.append((arr, nm))
    kernel = {"nsim_kernel": 1, "name": results[0].kernel["name"], "cores": lnc, "core_programs": progs}
    return TraceResult(kernel, inputs, last.ret_spec, writeback, reports, set().union(*(r.split_sites for r in results)))


def _written_tensors(body):
    """Names of the tensors some op of ``body`` writes (its ``dst``)."""
    out, stack = set(), [body]
    while stack:
        for s in stack.pop():
            if "op" in s:
                d = s.get("dst")
                out.add(d.get("tensor") if isinstance(d, dict) else d)
            elif "loop" in s:
                stack.append(s["loop"].get("body", []))
    return out


class _Retry(BaseException):
    """Internal: trace the kernel again with the loop ``key`` peeled (``peel``) or unrolled (``key`` None:
    every loop)."""

    def __init__(self, key, why, peel=False, pair=False, expand=False, sanitizer=False):
        super().__init__(why)
        self.key, self.why, self.peel, self.pair, self.expand = key, why, peel, pair, expand
        self.sanitizer = sanitizer


#: Loop decisions (loops unrolled, peeled, paired; everything unrolled) of the last trace of a kernel function for
#: one kind of arguments (_plan_key): a later trace of it starts from them instead of finding them again by
#: retries. Starting from them is always sound (unrolling, peeling and pairing give the same instructions'
#: values; a decision that no longer holds is found again by a retry), and the trace gives the same IR as
#: the last attempt of the trace that made them.
_LOOP_PLANS = {}
_MAX_LOOP_PLANS = 1024


def _arg_kind(v, depth=0):
    """A hashable description of a kernel argument for _plan_key: arrays by shape and dtype, plain values by
    type and value; None when the argument is of another kind (then nothing is remembered)."""
    if isinstance(v, np.ndarray):
        return ("a", v.shape, v.dtype.str)
    if v is None or isinstance(v, (bool, int, float, str, np.integer, np.floating)):
        return ("v", type(v).__name__, v)
    if isinstance(v, (tuple, list)) and depth < 4 and len(v) <= 64:
        kinds = tuple(_arg_kind(x, depth + 1) for x in v)
        return None if any(k is None for k in kinds) else (type(v).__name__, kinds)
    if type(v) is dict and depth < 4 and len(v) <= 64:
        kinds = tuple((k, _arg_kind(x, depth + 1)) for k, x in v.items())
        return None if any(k[1] is None for k in kinds) else ("dict", kinds)
    return None


def _plan_key(fn, args, kwargs, check, lnc, config, overrides):
    kinds = tuple(_arg_kind(a) for a in args) + tuple((k, _arg_kind(v)) for k, v in sorted(kwargs.items()))
    if any(k is None or (isinstance(k, tuple) and k[1] is None) for k in kinds):
        return None
    try:
        key = (getattr(fn, "nsim_plan_id", fn), kinds, check if check == "strict" else bool(check), tuple(lnc) if lnc is not None else None, config,
               tuple(overrides) if isinstance(overrides, (list, tuple)) else
               tuple(sorted(overrides.items())) if isinstance(overrides, dict) else overrides)
        hash(key)
    except TypeError:
        return None
    return key


#: NSIM_EXPLAIN_LOOPS=1: print on stderr which loop is unrolled and why, each time trace() starts again.
_EXPLAIN_LOOPS = os.environ.get("NSIM_EXPLAIN_LOOPS", "") not in ("", "0")
_progress_hook = None  # trace()'s ``progress`` while it runs (each attempt's Tracer takes it)
PROGRESS_STATEMENTS = 4096  # statements between two calls of a trace's progress hook

#: How often trace() may start again with one more loop unrolled (a guard: each retry unrolls a new loop).
MAX_TRACE_RETRIES = 64


def trace(fn, args, kwargs, name=None, tensor_cls=None, schedule=None, config=None, overrides=None, check=False,
          lnc=None, loops=None, progress=None):
    """Run ``fn`` under a fresh tracer; return a TraceResult. ``tensor_cls``: the NkiTensor subclass the
    tensors of this kernel are made of (a dialect frontend's view class). ``schedule``: with_schedule
    edges [(after, [before, ...]), ...], checked against the op labels once the kernel has run.

    Loops are kept as loops where the tracer can (Tracer.symbolic_loop); when recording a loop
    symbolically fails, the kernel is traced again from the start with that loop (its source line)
    unrolled. An error of the kernel itself is reported as the fully unrolled trace reports it. ``progress``:
    called as ``progress(statements)`` every 4,096 statements a trace records (each attempt counts from 0)."""
    # The cyclic garbage collector is paused while the kernel runs: tracing allocates many small
    # containers that live until the trace ends, and the collections they trigger rescanned them (5 % of
    # a flash attention's simulate(), docs/performance.md). Cycles made meanwhile are collected after.
    global _progress_hook
    gc_was = gc.isenabled()
    gc.disable()
    _progress_hook = progress
    try:
        return _trace(fn, args, kwargs, name, tensor_cls, schedule, config, overrides, check, lnc, loops)
    finally:
        _progress_hook = None
        if gc_was:
            gc.enable()


def _trace(fn, args, kwargs, name, tensor_cls, schedule, config, overrides, check, lnc, loops):
    unroll, peel, pair, expand, unroll_all = set(), set(), set(), set(), loops_mode(loops) == "unroll"
    sanitized = False  # some loop decision was the sanitizer's alone (_unsanitized)
    plan_key = None if unroll_all else _plan_key(fn, args, kwargs, check, lnc, config, overrides)
    plan = _LOOP_PLANS.get(plan_key) if plan_key is not None else None
    if plan is not None:  # this kernel's loop decisions for these argument kinds, from its last trace
        unroll, peel, pair, unroll_all, expand = set(plan[0]), set(plan[1]), set(plan[2]), plan[3], set(plan[4])
        sanitized = plan[5]
    for _attempt in range(MAX_TRACE_RETRIES + 1):
        try:
            tres = _trace_once(fn, args, kwargs, name, tensor_cls, schedule, config, overrides, check, lnc,
                               unroll, peel, unroll_all, pair, expand)
            if plan_key is not None:
                if len(_LOOP_PLANS) >= _MAX_LOOP_PLANS:
                    _LOOP_PLANS.clear()
                _LOOP_PLANS[plan_key] = (frozenset(unroll), frozenset(peel), frozenset(pair), unroll_all,
                                         frozenset(expand), sanitized)
            return _unsanitized(tres, check and sanitized, fn, args, kwargs, name, tensor_cls, schedule, config,
                                overrides, lnc, loops)
        except _Retry as e:
            sanitized = sanitized or e.sanitizer
            peeling = e.peel and e.key is not None and e.key not in peel and e.key not in unroll
            pairing = e.pair and e.key in peel and e.key not in pair and e.key not in unroll
            expanding = e.expand and e.key is not None and e.key not in expand and e.key not in unroll
            if _EXPLAIN_LOOPS:
                sys.stderr.write("nsim: {} the loop at {}: {}\n".format(
                    "writing out" if expanding else "peeling" if peeling else
                    "pairing the iterations of" if pairing else "unrolling",
                    "{}:{}".format(os.path.basename(e.key[0]), e.key[1]) if e.key else "(every loop)", e.why))
            if expanding:
                expand.add(e.key)
            elif peeling:
                peel.add(e.key)
            elif pairing:
                pair.add(e.key)
            elif e.key is None or e.key in unroll:
                if unroll_all:
                    raise make_error("Internal", "tracer: a loop traced unrolled asked to be unrolled ({})".format(
                        e.why)) from None
                unroll_all = True
            else:
                unroll.add(e.key)
    tres = _trace_once(fn, args, kwargs, name, tensor_cls, schedule, config, overrides, check, lnc, unroll, peel,
                       True, pair, expand)
    return _unsanitized(tres, check and sanitized, fn, args, kwargs, name, tensor_cls, schedule, config, overrides,
                        lnc, loops)


def _unsanitized(tres, again, fn, args, kwargs, name, tensor_cls, schedule, config, overrides, lnc, loops):
    """The sanitizer must not change what is simulated. Its affine_range check unrolls (or peels) a loop it cannot
    show safe as recorded, to check it write by write; as unrolled, the loop's tiles are placed as an unrolled
    trace places them, and the simulated time may differ from the run without the sanitizer (the library's
    attention_naive by 6 %, an LNC=2 flash-decoding sample's one-core variant by 25 %: docs/debugging.md). When it did (`again`), the kernel is traced once more without
    it: that trace is what is simulated, with the sanitizer's reports (and split sites) of the checked one."""
    if not again:
        return tres
    clean = _trace(fn, args, kwargs, name, tensor_cls, schedule, config, overrides, False, lnc, loops)
    clean.check_reports = tres.check_reports
    clean.split_sites |= tres.split_sites
    return clean


def _trace_once(fn, args, kwargs, name, tensor_cls, schedule, config, overrides, check, lnc, unroll, peel,
                unroll_all, pair=frozenset(), expand=frozenset()):
    sig = inspect.signature(fn)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise make_error("BadKernelArgs", "bad kernel arguments: {}".format(e))
    tr = Tracer(name or getattr(fn, "__name__", "kernel"), tensor_cls=tensor_cls)
    if config is not None:
        tr.config = config
    if overrides:
        tr.overrides = overrides
    tr.check = bool(check)
    tr.strict = check == "strict"
    if lnc is not None:
        tr.lnc = (int(lnc[0]), int(lnc[1]))
    tr.unroll, tr.peel, tr.pair, tr.expand = unroll, peel, pair, expand
    tr.unroll_all = unroll_all
    arrays = tr.arguments  # IR name -> (caller array, tensor)
    call_args = {}
    with tr:
        for pname, val in bound.arguments.items():
            kind = sig.parameters[pname].kind
            if kind == inspect.Parameter.VAR_POSITIONAL:
                out = []
                for i, v in enumerate(val):
                    out.append(_arg(tr, "{}{}".format(pname, i), v, arrays))
                call_args[pname] = tuple(out)
            elif kind == inspect.Parameter.VAR_KEYWORD:
                call_args[pname] = {k: _arg(tr, k, v, arrays) for k, v in val.items()}
            else:
                call_args[pname] = _arg(tr, pname, val, arrays)
        b2 = sig.bind_partial()
        b2.arguments.update(call_args)
        try:
            ret = fn(*b2.args, **b2.kwargs)
            if tr._broken is not None:
                raise _NeedsConcrete("a loop recorded symbolically was left by break or return", tr._broken)
        except (KeyboardInterrupt, SystemExit, _Retry):
            raise
        except _NeedsConcrete as e:
            key = e.key or (tr._recs[-1].key if tr._recs else None) or tr._broken
            raise _Retry(key, e.why, e.peel, e.pair, e.expand, e.sanitizer) from None
        except BaseException as e:
            if not tr._symbolic:
                raise
            # an error while loops were kept symbolic: blame the loop being recorded, else trace everything
            # unrolled (the error, if real, is then the one the unrolled trace gives)
            key = (tr._recs[-1].key if tr._recs else None) or tr._broken
            raise _Retry(key, "{}: {}".format(type(e).__name__, e)) from None

        # outputs: returned HBM tensors, plus arguments the kernel wrote (copied back to the caller)
        by_name = {t["name"]: t for t in tr.tensors}
        rename = {}
        writeback = []
        inputs = {}
        for ir_name, (arr, _t) in arrays.items():
            if ir_name in tr.written:
                out_name = tr.unique_name(ir_name + "__out")
                rename[ir_name] = out_name
                writeback.append((arr, out_name))
            inputs[ir_name] = _to_numpy(arr)
        inputs.update(tr.constants)

        def spec(r):
            if r is None:
                return None
            if isinstance(r, NkiTensor) and isinstance(r._st, _ViewStorage) and r._st.buffer == "hbm":
                base, off, pat = r._flat()
                if off == 0 and [it[:2] for it in _merge(pat)] == [[1, int(np.prod(base.shape))]]:
                    inner = spec(type(r)(base, None, r._tracer))  # a reshape of a whole HBM tensor
                    return ("reshaped", (inner, tuple(r.shape)))
            if isinstance(r, NkiTensor):
                if r._st.buffer != "hbm" or not r.is_full():
                    raise make_error("BadKernelReturn", "a kernel can only return whole HBM tensors "
                                     "(nl.ndarray(..., buffer=nl.shared_hbm)); got {!r}".format(r))
                nm = r._st.name
                if (type(r) is NkiTensor and by_name.get(nm, {}).get("kind") == "internal" and
                        nm not in tr.shared_hbm):  # (the new dialect's view class; Beta 1 has its own)
                    msg = ("the kernel returns '{}', an nl.hbm (private_hbm) tensor: NKI 0.3 and later reject returning "
                           "it; allocate outputs with buffer=nl.shared_hbm (nki-api.md 1.3)".format(r._st.name))
                    if getattr(tr, "strict", False):
                        raise make_error("StrictRule", msg)
                    warnings.warn(msg, NkiWarning, stacklevel=2)
                nm = rename.get(nm, nm)
                if nm in by_name and by_name[nm]["kind"] != "input":
                    by_name[nm]["kind"] = "output"
                return ("tensor", nm)
            if isinstance(r, (tuple, list)):
                return (type(r), [spec(x) for x in r])
            if isinstance(r, dict):
                return (dict, {k: spec(v) for k, v in r.items()})
            return ("value", r)

        # written arguments: input `a` + output `a__out` that starts as a copy of it ("init": made before the
        # kernel runs, not simulated: on hardware the kernel writes the argument's own storage), ops retargeted
        if rename:
            for old, new in rename.items():
                src = by_name[old]
                d = dict(src, name=new, kind="output", init=old)
                tr.tensors.append(d)
                by_name[new] = d
            _retarget(tr.body, rename)
        ret_spec = spec(ret)
        if ret is None and not writeback:
            _warn_unreturned(fn, [t["name"] for t in tr.tensors if t["name"] in tr.shared_hbm and
                                  t["name"] in tr.written])
        tr.name_shared_tiles()
        tr.set_schedule(schedule)
    return TraceResult(tr.to_json(), inputs, ret_spec, writeback, tr.check_reports, tr.split_sites)


def _warn_unreturned(fn, names):
    """A kernel that returns nothing (None) and writes no argument, but writes shared_hbm tensors it made: their
    values are lost (the usual cause: a forgotten ``return out``). A warning, not an error (docs/debugging.md):
    the kernel is legal and may be run for its timing only."""
    if not names:
        return
    code = getattr(fn, "__code__", None)
    msg = ("kernel {!r} returns None but writes the shared_hbm tensor{} {}: {} values are lost (return {} from the "
           "kernel)".format(getattr(fn, "__name__", "kernel"), "s" if len(names) > 1 else "",
                            ", ".join(repr(n) for n in names), "their" if len(names) > 1 else "its",
                            ", ".join(names)))
    if code is not None:
        warnings.warn_explicit(UnreturnedOutputWarning(msg), UnreturnedOutputWarning, code.co_filename,
                               code.co_firstlineno)
    else:
        warnings.warn(UnreturnedOutputWarning(msg), stacklevel=2)


class UnreturnedOutputWarning(UserWarning):
    """A kernel returned None although it wrote shared_hbm tensors it made (their values are lost)."""


def _arg(tr, name, val, arrays):
    if isinstance(val, NkiTensor):
        return val  # sub-kernel call with tensors
    if _is_array(val):
        a = _to_numpy(val)
        t = tr.hbm_tensor(name, a.dtype, a.shape if a.ndim else (1,), kind="input")
        arrays[t.name] = (val, t)
        return t
    if isinstance(val, (list, tuple)) and any(_holds_array(v) for v in val):
        # A list or tuple of arrays (nested ones too): each array its own HBM tensor, named after the argument
        # and its position (xs -> xs_0, xs_1, ...); other items passed as they are.
        items = [_arg(tr, "{}_{}".format(name, i), v, arrays) for i, v in enumerate(val)]
        return type(val)(*items) if hasattr(val, "_fields") else type(val)(items)  # a namedtuple takes fields
    if isinstance(val, dict) and any(_holds_array(v) for v in val.values()):
        # A dict of arrays (a model's weights by name): each array its own HBM tensor, named after the argument
        # and its key (params -> params_w1, ...; Tracer.unique_name makes the key a name); the kernel gets a dict.
        return {k: _arg(tr, "{}_{}".format(name, k), v, arrays) for k, v in val.items()}
    return val


def _holds_array(v):
    return _is_array(v) or (isinstance(v, (list, tuple)) and any(_holds_array(x) for x in v)) or (
        isinstance(v, dict) and any(_holds_array(x) for x in v.values()))


def _to_numpy(a):
    if isinstance(a, np.ndarray):
        return a
    try:  # torch
        import torch  # noqa: F401
        if a.dtype == torch.bfloat16:
            return a.float().numpy().astype(np_dtype("bfloat16"))
        return a.detach().cpu().numpy()
    except Exception:
        return np.asarray(a)


def _retarget(body, rename):
    for s in body:
        if "op" in s:
            for k in _slot_keys():
                v = s.get(k)
                if isinstance(v, str) and v in rename:
                    s[k] = rename[v]
                elif isinstance(v, dict) and v.get("tensor") in rename:
                    v["tensor"] = rename[v["tensor"]]
        elif "loop" in s:
            _retarget(s["loop"].get("body", []), rename)


def _simulate_fn():
    core = _core
    if core is None:
        try:
            from nsim import _core as core  # noqa: F811
        except Exception as e:
            raise ImportError("nsim._core is not available (build the _nsim extension): {}".format(e))
    return core.simulate_json


def run(tres, config="trn2", **sim_kwargs):
    """Simulate a traced kernel; return (return value, outputs dict, profile)."""
    simulate_json = _simulate_fn()
    k = tres.kernel
    dts = {t["name"]: t["dtype"] for p in k.get("core_programs", [k]) for t in p["tensors"]}
    inputs = {}
    for n, a in tres.inputs.items():
        want = np_dtype(dts[n])
        a = np.asarray(a)
        inputs[n] = a.reshape(-1) if a.ndim == 0 else a
        if inputs[n].dtype != want:
            inputs[n] = inputs[n].astype(want)
    check = sim_kwargs.pop("check", False)
    outputs, profile = simulate_json(k, inputs=inputs, config=config, check=bool(check), **sim_kwargs)
    if check:
        # NSIM-W509 on the boxes a non-rectangular mask was split into: nsim's lowering (a triangle's rows), not a
        # view the kernel wrote, so not the kernel's to fix (docs/debugging.md, "Non-rectangular masks")
        split = getattr(tres, "split_sites", ())
        sim_reports = [r for r in profile.check_reports
                       if not (r.get("check") == "start-partition" and (r.get("file"), r.get("line")) in split)]
        profile.check_reports = list(getattr(tres, "check_reports", ())) + sim_reports
        if profile.check_reports:
            report_checks(profile.check_reports, strict=(check == "strict"))

    handed = set()  # outputs already returned once: a second reference gets its own copy

    def conv(name):
        if name not in outputs:
            if name in tres.inputs and not profile.timing_only:  # an input returned as it is (never written)
                return np.array(inputs[name], copy=True)
            return None  # timing_only: no numerics, no output arrays
        a = np.asarray(outputs[name])  # a new array of the core's (nothing else refers to it)
        want = np_dtype(dts[name])
        if a.dtype != want:
            return a.astype(want)
        if name in handed:
            return a.copy()
        handed.add(name)
        return a

    def build(s):
        if s is None:
            return None
        tag, v = s
        if tag == "tensor":
            return conv(v)
        if tag == "value":
            return v
        if tag == "reshaped":
            a = build(v[0])
            return None if a is None else a.reshape(v[1])
        if tag is dict:
            return {kk: build(x) for kk, x in v.items()}
        if tag is list:  # spec 1.6: a tuple/list of tensors -> a tuple of arrays, in order
            tag = tuple
        if hasattr(tag, "_fields"):  # a namedtuple takes its fields positionally
            return tag(*(build(x) for x in v))
        return tag(build(x) for x in v)

    for arr, name in tres.writeback:
        if name in outputs:
            res = conv(name)
            if isinstance(arr, np.ndarray):
                arr[...] = res.astype(arr.dtype).reshape(arr.shape)
            else:  # torch
                try:
                    import torch
                    arr.copy_(torch.from_numpy(res.astype(np.float32)).to(arr.dtype).reshape(arr.shape))
                except Exception:
                    pass
    return build(tres.ret_spec), outputs, profile


class NkiWarning(UserWarning):
    """``nki.NkiWarning`` (spec 4.1): a deprecated-but-accepted form (``nki.jit(mode=...)``, ...) or a hardware rule
    the kernel may get away with (the sanitizer's reports, :class:`CheckWarning`)."""


class CheckWarning(NkiWarning):
    """A report of the sanitizer (``options(check=True)``): ``.report`` is the dict of the report (code,
    check, op, tensor, detail, file, line, function, instruction, count, fix, message)."""

    def __init__(self, report):
        self.report = dict(report)
        super().__init__(self.report["message"])


def nki_warn(message, stacklevel=2):
    """A form nki-api.md accepts with a warning: an NkiWarning at the caller's caller (``stacklevel`` as
    warnings.warn counts from the caller), or, when the kernel is traced with ``check="strict"`` (spec 4.1:
    "strict ... turns lint-level checks into errors"), a StrictRule KernelError at the user's line."""
    tr = active()
    if tr is not None and getattr(tr, "strict", False):
        raise make_error("StrictRule", message)
    warnings.warn(message, NkiWarning, stacklevel=stacklevel + 1)


def report_checks(reports, strict=False):
    """Issue the sanitizer's reports as CheckWarning warnings attributed to the kernel's line (or, with
    ``strict``, raise the first as a KernelError)."""
    for r in reports:
        if strict:
            # a sanitizer code (NSIM-Wxxx, engines/check/checker.h), not a row of the error table
            raise KernelError(r["message"], code=r["code"], file=r["file"], line=r["line"], function=r["function"])
        if r.get("file") and r.get("line"):
            warnings.warn_explicit(CheckWarning(r), CheckWarning, r["file"], int(r["line"]))
        else:
            warnings.warn(CheckWarning(r), stacklevel=3)


def count_ops(body):
    """(ops in the kernel.json statements ``body``, ops they execute): a loop's ops count once in the first,
    once per iteration in the second."""
    ir = executed = 0
    for s in body:
        if "op" in s:
            ir, executed = ir + 1, executed + 1
        elif "loop" in s:
            lp = s["loop"]
            a, b = count_ops(lp.get("body", []))
            ir, executed = ir + a, executed + b * len(range(lp.get("start", 0), lp["stop"], lp.get("step", 1)))
    return ir, executed


def dumps(kernel, indent=None):
    """kernel.json text (deterministic). Compact by default: json's C encoder (an ``indent`` uses the
    pure-Python encoder, slow on big kernels)."""
    if indent is None:
        return json.dumps(kernel, separators=(",", ":"))
    return json.dumps(kernel, indent=indent)

